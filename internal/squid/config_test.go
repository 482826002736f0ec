package squid

import (
	"flag"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var configCases = map[string]struct {
	reason string
	cfg    Config
}{
	"auth-only": {
		reason: "Credentials alone admit any client that authenticates.",
		cfg:    Config{Port: 3128, HtpasswdPath: "/etc/squid/htpasswd"},
	},
	"ranges-only": {
		reason: "Source ranges alone admit those networks without credentials.",
		cfg:    Config{Port: 3128, AllowedSourceRanges: []string{"192.168.0.0/16", "10.0.0.0/8"}},
	},
	"auth-and-ranges": {
		reason: "Both: only those networks, and only with credentials.",
		cfg: Config{
			Port: 8080, HtpasswdPath: "/etc/squid/htpasswd",
			AllowedSourceRanges: []string{"203.0.113.0/24", "2001:db8::/32"},
		},
	},
	"local-process": {
		reason: "The local backend binds loopback, writes logs and pid to its state dir, and lets clients reach loopback targets.",
		cfg: Config{
			Port: 31280, BindAddress: "127.0.0.1", HtpasswdPath: "/var/lib/egress/p/htpasswd",
			PidFile: "/var/lib/egress/p/squid.pid", AccessLog: "stdio:/var/lib/egress/p/access.log",
			CacheLog: "/var/lib/egress/p/cache.log", CoreDumpDir: "/var/lib/egress/p",
			AllowLoopbackDestinations: true, OutgoingAddress: "127.0.0.1",
		},
	},
	"local-own-egress": {
		reason: "A local proxy on loopback sends to loopback targets from an address of its own, and to any other as routing has it.",
		cfg: Config{
			Port: 31281, BindAddress: "127.0.0.1", HtpasswdPath: "/var/lib/egress/p/htpasswd",
			AllowLoopbackDestinations: true, LoopbackOutgoingAddress: "127.1.122.33",
		},
	},
	"rotating-credentials": {
		reason: "Credentials that rotate in place go through the helper script, which also accepts the previous file's until its deadline, and are revalidated every 10 seconds.",
		cfg: Config{
			Port: 3128, HtpasswdPath: "/etc/egress-proxy/htpasswd", PreviousHtpasswdPath: "/etc/egress-proxy/htpasswd.previous",
			AuthScriptPath: "/etc/egress-proxy/auth.sh",
		},
	},
	"whole-families": {
		reason: "A whole address family is named, as Squid wants: it refuses 0.0.0.0/0, taking it for both families.",
		cfg:    Config{Port: 3128, HtpasswdPath: "/etc/squid/htpasswd", AllowedSourceRanges: []string{"0.0.0.0/0"}},
	},
	"ipv6-bind": {
		reason: "An IPv6 bind address is bracketed.",
		cfg:    Config{Port: 3128, BindAddress: "::1", AllowedSourceRanges: []string{"::1/128"}},
	},
}

func TestRenderGolden(t *testing.T) {
	for name, tc := range configCases {
		t.Run(name, func(t *testing.T) {
			got, err := Render(tc.cfg)
			if err != nil {
				t.Fatalf("%s\nRender: %v", tc.reason, err)
			}
			golden := filepath.Join("testdata", name+".conf")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./internal/squid -update to create it)", err)
			}
			if diff := cmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("%s\n-golden, +rendered:\n%s", tc.reason, diff)
			}
		})
	}
}

// TestRealSquidParses feeds every generated config to `squid -k parse`.
func TestRealSquidParses(t *testing.T) {
	bin := testbed.SquidBinary(t)
	for name, tc := range configCases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := tc.cfg
			// Squid checks that the files it will write are writable, so
			// point them into a scratch dir; everything else is as generated.
			cfg.PidFile = filepath.Join(dir, "squid.pid")
			cfg.CoreDumpDir = dir
			cfg.CacheLog = filepath.Join(dir, "cache.log")
			b, err := Render(cfg)
			if err != nil {
				t.Fatal(err)
			}
			conf := filepath.Join(dir, "squid.conf")
			if err := os.WriteFile(conf, b, 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(bin, "-k", "parse", "-f", conf).CombinedOutput()
			if err != nil {
				t.Fatalf("%s\nsquid -k parse rejected the config: %v\n%s\n%s", tc.reason, err, out, b)
			}
			if line := parseComplaint(string(out)); line != "" {
				t.Errorf("%s\nsquid -k parse reported: %s", tc.reason, line)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	cases := map[string]struct {
		reason string
		cfg    Config
		want   string
	}{
		"Open":                        {reason: "No credentials and no ranges is an open proxy.", cfg: Config{Port: 3128}, want: "refusing an open proxy"},
		"WorldNoAuth":                 {reason: "0.0.0.0/0 without credentials is open too.", cfg: Config{Port: 3128, AllowedSourceRanges: []string{"0.0.0.0/0"}}, want: "open proxy"},
		"HalvesNoAuth":                {reason: "Two halves of the internet are the internet: judged by arithmetic, not strings.", cfg: Config{Port: 3128, AllowedSourceRanges: []string{"10.0.0.0/8", "0.0.0.0/1", "128.0.0.0/1"}}, want: `allowed source range "0.0.0.0/1" is not private`},
		"WideNoAuth":                  {reason: "A range wider than a private block reaches outside it.", cfg: Config{Port: 3128, AllowedSourceRanges: []string{"10.0.0.0/7"}}, want: `"10.0.0.0/7" is not private`},
		"PublicV6NoAuth":              {reason: "A public IPv6 range needs credentials.", cfg: Config{Port: 3128, AllowedSourceRanges: []string{"2001:db8::/32"}}, want: "open proxy"},
		"PublicException":             {reason: "An exception is for private networks: public ones need none.", cfg: Config{Port: 3128, HtpasswdPath: "/h", AllowedPrivateDestinations: []string{"198.18.0.0/15"}}, want: "is not a private network"},
		"BadPort":                     {reason: "Port 0 cannot be bound.", cfg: Config{Port: 0, HtpasswdPath: "/h"}, want: "port 0"},
		"BadCIDR":                     {reason: "Ranges are CIDRs.", cfg: Config{Port: 1, AllowedSourceRanges: []string{"10.0.0.1"}}, want: "not a CIDR"},
		"BadBind":                     {reason: "Bind addresses are IPs.", cfg: Config{Port: 1, HtpasswdPath: "/h", BindAddress: "localhost"}, want: "bind address"},
		"InjectedNewline":             {reason: "A path cannot smuggle in a directive.", cfg: Config{Port: 1, HtpasswdPath: "/h\nhttp_access allow all"}, want: `must not contain '\n'`},
		"Macro":                       {reason: "Squid expands ${...} in its config, so a path with one names another file (found by FuzzRenderParses).", cfg: Config{Port: 1, HtpasswdPath: "/etc/${service_name}/htpasswd"}, want: `must not contain '$'`},
		"RelativePath":                {reason: "A relative path depends on Squid's working folder.", cfg: Config{Port: 1, HtpasswdPath: "htpasswd"}, want: "must be absolute"},
		"RelativeLog":                 {reason: "The access log's module prefix aside, its path is absolute too.", cfg: Config{Port: 1, HtpasswdPath: "/h", AccessLog: "stdio:access.log"}, want: "must be absolute"},
		"ZoneSmuggle":                 {reason: "An IPv6 zone is free text: it could carry a directive into the config.", cfg: Config{Port: 1, HtpasswdPath: "/h", BindAddress: "fe80::1%x\nhttp_access allow all"}, want: "must not have a zone"},
		"OwnZone":                     {reason: "Own addresses have no zone either.", cfg: Config{Port: 1, HtpasswdPath: "/h", OwnAddresses: []string{"fe80::1%eth0"}}, want: "must not have a zone"},
		"LoopbackOutgoingNotLoopback": {reason: "The loopback outgoing address is a loopback one.", cfg: Config{Port: 1, HtpasswdPath: "/h", LoopbackOutgoingAddress: "10.0.0.1"}, want: "not an IPv4 address in 127.0.0.0/8"},
		"LoopbackOutgoingAndOutgoing": {reason: "Squid takes the first tcp_outgoing_address that matches: one or the other.", cfg: Config{Port: 1, HtpasswdPath: "/h", OutgoingAddress: "127.0.0.1", LoopbackOutgoingAddress: "127.1.0.1"}, want: "exclude each other"},
		"MappedOutgoing":              {reason: "An IPv4-mapped address is written as IPv4.", cfg: Config{Port: 1, HtpasswdPath: "/h", OutgoingAddress: "::ffff:10.0.0.1"}, want: "IPv4-mapped"},
		"OddSpelling":                 {reason: "Only the canonical spelling, which Squid reads the same way.", cfg: Config{Port: 1, HtpasswdPath: "/h", OwnAddresses: []string{"2001:DB8::1"}}, want: "must be written as 2001:db8::1"},
		"RelativeOwnFile":             {reason: "The own-addresses file is an absolute path.", cfg: Config{Port: 1, HtpasswdPath: "/h", OwnAddressesFile: "self"}, want: "absolute path"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Render(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s\nwant an error containing %q, got %v", tc.reason, tc.want, err)
			}
		})
	}
}

func TestPrivateSourcesWithoutCredentials(t *testing.T) {
	for _, ranges := range [][]string{
		{"10.0.0.0/8"}, {"10.1.2.0/24", "192.168.0.0/16", "172.16.0.0/12"}, {"100.64.0.0/10"}, {"127.0.0.1/32"},
		{"fd00::/8"}, {"::1/128"},
	} {
		if _, err := Render(Config{Port: 3128, AllowedSourceRanges: ranges}); err != nil {
			t.Errorf("private client ranges %v need no credentials: %v", ranges, err)
		}
	}
}

func TestAPR1MatchesOpenSSL(t *testing.T) {
	// Vectors from `openssl passwd -apr1 -salt SALT PASSWORD`, an independent
	// implementation.
	cases := []struct{ salt, password, want string }{
		{"abcdefgh", "secret", "$apr1$abcdefgh$h9FWgUz3n9YxylKLlR5SQ/"},
		{"abcdefgh", "", "$apr1$abcdefgh$L.PT565ESX4Tp2bqNs7Ie."},
		{"abcdefgh", "a much longer password with spaces and more than sixteen chars", "$apr1$abcdefgh$nM6Tb.ey6YgQR78Wgyw/K0"},
		{"12345678", "secret", "$apr1$12345678$0lqb/6VUFP8JY/s/jTrIk0"},
		{"./xyZ09", "secret", "$apr1$./xyZ09$0k4M.fje140iVQQvRR2ws0"},
		{"./xyZ09", "a much longer password with spaces and more than sixteen chars", "$apr1$./xyZ09$8CX/x.2K00.PgcuJKQ48Y/"},
	}
	for _, tc := range cases {
		if got := apr1(tc.password, tc.salt); got != tc.want {
			t.Errorf("apr1(%q, %q) = %q, want %q", tc.password, tc.salt, got, tc.want)
		}
	}
}

// TestRealHelperAcceptsHtpasswd checks the generated file with Squid's own
// basic_ncsa_auth helper, the program that reads it in production.
func TestRealHelperAcceptsHtpasswd(t *testing.T) {
	testbed.SquidBinary(t)
	if _, err := os.Stat(DefaultAuthHelper); err != nil {
		t.Fatalf("%s is missing: run `apt-get install -y squid`", DefaultAuthHelper)
	}
	line, err := Htpasswd("crawler", "s3cret pass")
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "htpasswd")
	if err := os.WriteFile(f, line, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(DefaultAuthHelper, f)
	cmd.Stdin = strings.NewReader("crawler s3cret%20pass\ncrawler wrong\nintruder s3cret%20pass\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "OK") || !strings.HasPrefix(lines[1], "ERR") || !strings.HasPrefix(lines[2], "ERR") {
		t.Errorf("basic_ncsa_auth answers: want OK, ERR, ERR; got %q", lines)
	}
}

func TestHtpasswdRejectsBadInput(t *testing.T) {
	for _, tc := range []struct{ user, pass, want string }{{"", "p", errUsername}, {"a:b", "p", errUsername}, {"u", "", errPassword}, {"u", "p\nx", errPassword}} {
		if _, err := HtpasswdWithSalt(tc.user, tc.pass, "abc"); err == nil || err.Error() != tc.want {
			t.Errorf("HtpasswdWithSalt(%q, %q): got %v, want %q", tc.user, tc.pass, err, tc.want)
		}
	}
}

// TestSubtract checks the carving of exceptions out of the denied networks
// address by address: an address is still denied exactly when it is in a
// private network and in no exception.
func TestSubtract(t *testing.T) {
	exceptions := prefixes("10.99.0.0/16", "192.168.7.128/25", "fd12:3456::/32")
	got := subtract(PrivateDestinations, exceptions)
	in := func(a netip.Addr, nets []netip.Prefix) bool {
		for _, n := range nets {
			if n.Contains(a) {
				return true
			}
		}
		return false
	}
	for _, s := range []string{
		"10.99.0.1", "10.99.255.255", "10.98.255.255", "10.100.0.0", "10.0.0.1", "10.255.255.255",
		"192.168.7.127", "192.168.7.128", "192.168.7.255", "192.168.8.0", "172.16.0.1", "8.8.8.8", "198.18.0.2",
		"fd12:3456::1", "fd12:3457::1", "fc00::1", "2001:db8::1", "2606:4700::1",
	} {
		a := netip.MustParseAddr(s)
		want := in(a, PrivateDestinations) && !in(a, exceptions)
		if got := in(a, got); got != want {
			t.Errorf("%s: denied %v, want %v", s, got, want)
		}
	}
	if diff := cmp.Diff(joinPrefixes(PrivateDestinations), joinPrefixes(subtract(PrivateDestinations, nil))); diff != "" {
		t.Errorf("no exception carves nothing: -want +got:\n%s", diff)
	}
}

// TestLoopbackOnlyWhenBoundToLoopback: a policy allowing loopback
// destinations takes effect only for a proxy bound to a loopback address;
// bound everywhere or to another address, it still denies loopback.
func TestLoopbackOnlyWhenBoundToLoopback(t *testing.T) {
	for bind, allowed := range map[string]bool{"127.0.0.1": true, "::1": true, "": false, "0.0.0.0": false, "::": false, "10.1.2.3": false} {
		conf, err := Render(Config{Port: 3128, BindAddress: bind, AllowLoopbackDestinations: true, HtpasswdPath: "/etc/egress-proxy/htpasswd"})
		if err != nil {
			t.Fatalf("bind %q: %v", bind, err)
		}
		if denies := strings.Contains(string(conf), "http_access deny egress_loopback\n"); denies == allowed {
			t.Errorf("bind %q with loopback destinations allowed: denies loopback %v, want %v", bind, denies, !allowed)
		}
	}
}
