"""Fetch through egress-discovery's gateway with Python requests.

The gateway URL is the only setting: the fleet and a session in the
username, a discovery token as the password (egressctl gateway-url prints
it). Every request of the session leaves through the same proxy.

    GATEWAY_URL=$(egressctl gateway-url --fleet crawl-team/crawlers --session s1 --gateway https://egress-discovery.egress-system.svc:8888)
    EGRESS_DISCOVERY_CA_FILE=/etc/egress-discovery/ca.crt python3 requests_gateway.py https://shop.example/
"""
import os
import sys

import requests

proxies = {"http": os.environ["GATEWAY_URL"], "https": os.environ["GATEWAY_URL"]}
session = requests.Session()
session.proxies.update(proxies)
# The gateway serves TLS with egress-discovery's certificate: requests
# checks the proxy's certificate against REQUESTS_CA_BUNDLE (or verify=).
os.environ.setdefault("REQUESTS_CA_BUNDLE", os.environ.get("EGRESS_DISCOVERY_CA_FILE", ""))
for url in sys.argv[1:]:
    r = session.get(url, timeout=30)
    print(r.status_code, url)
