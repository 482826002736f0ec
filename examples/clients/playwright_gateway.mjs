// Browse through egress-discovery's gateway with Playwright (Node).
// The username names the fleet and a session, so that every request of
// the page leaves through the same proxy; the password is a discovery
// token. Chromium takes the proxy's CA from the system store: trust
// egress-discovery's CA there, or run the gateway with a certificate the
// browser already trusts.
//
//   GATEWAY=https://egress-discovery.egress-system.svc:8888 TOKEN=... node playwright_gateway.mjs https://shop.example/
import { chromium } from "playwright";

const browser = await chromium.launch({
  proxy: {
    server: process.env.GATEWAY,
    username: "crawl-team_crawlers_session_page1",
    password: process.env.TOKEN,
  },
});
const page = await browser.newPage();
await page.goto(process.argv[2]);
console.log(await page.title());
await browser.close();
