package squid

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// FuzzRenderParses asserts the generator's promise: every config Validate
// accepts is one real Squid parses without an error or a warning. Paths are
// fuzzed as names inside a scratch folder (so that Squid can open or write
// what it is given); everything else goes to Validate as fuzzed.
func FuzzRenderParses(f *testing.F) {
	bin := testbed.SquidBinary(f)
	for _, tc := range configCases {
		c := tc.cfg
		f.Add(c.Port, c.BindAddress, c.OutgoingAddress, strings.Join(c.AllowedSourceRanges, ","), c.HtpasswdPath != "",
			c.PreviousHtpasswdPath != "", c.AllowLoopbackDestinations, "", "", "htpasswd", false)
	}
	f.Add(int32(3128), "10.1.2.3", "10.1.2.3", "10.0.0.0/8,10.0.0.0/8", false, false, false, "10.1.0.0/16,10.1.0.0/24", "192.168.1.1,fd00::1", "p/h", true)
	f.Add(int32(3128), "", "", "", true, true, false, "169.254.0.0/16,fc00::/7", "", "${service_name}", true)
	f.Add(int32(3128), "", "", "0.0.0.0/0,::/0,1.2.3.4/0", true, false, false, "", "", "h", false)
	f.Fuzz(func(t *testing.T, port int32, bind, outgoing, sources string, auth, previous, loopback bool, privateDests, own, name string, files bool) {
		dir := t.TempDir()
		path := func(suffix string) string { return filepath.Join(dir, name+suffix) }
		c := Config{
			Port: port, BindAddress: bind, OutgoingAddress: outgoing,
			AllowedSourceRanges:        split(sources),
			AllowLoopbackDestinations:  loopback,
			AllowedPrivateDestinations: split(privateDests),
			OwnAddresses:               split(own),
			PidFile:                    filepath.Join(dir, "squid.pid"),
			CacheLog:                   filepath.Join(dir, "cache.log"),
			CoreDumpDir:                dir,
			AccessLog:                  "stdio:" + path(".access"),
		}
		if auth {
			c.HtpasswdPath = path(".htpasswd")
		}
		if previous {
			c.PreviousHtpasswdPath, c.AuthScriptPath = path(".previous"), path(".sh")
		}
		if files {
			c.OwnAddressesFile, c.HostsFile = path(".own"), path(".hosts")
		}
		conf, err := Render(c)
		if err != nil {
			return // refused, with a reason: nothing reaches Squid
		}
		// The files exist where the backends write them; a name that
		// cannot be a file here is outside the property.
		for _, p := range []string{c.HtpasswdPath, c.PreviousHtpasswdPath, c.AuthScriptPath, c.OwnAddressesFile, c.HostsFile} {
			if p == "" {
				continue
			}
			if !strings.HasPrefix(filepath.Clean(p), dir+"/") {
				return // the path leaves the scratch folder: outside the property
			}
			if os.MkdirAll(filepath.Dir(p), 0o755) != nil || os.WriteFile(p, nil, 0o644) != nil {
				return // no file can be there: outside the property
			}
		}
		file := filepath.Join(dir, "squid.conf")
		if err := os.WriteFile(file, conf, 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "-k", "parse", "-f", file).CombinedOutput()
		if err != nil {
			t.Fatalf("Validate accepted %+v, but squid -k parse failed: %v\n%s\n%s", c, err, out, conf)
		}
		if line := parseComplaint(string(out)); line != "" {
			t.Fatalf("Validate accepted %+v, but squid -k parse said:\n%s\n%s", c, line, conf)
		}
	})
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// parseComplaint returns the first line of Squid's parse output that is an
// error or a warning, but for the Via warning: "via off" is what the
// product wants, and Squid warns about it on principle.
func parseComplaint(out string) string {
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "HTTP requires the use of Via") {
			continue
		}
		for _, bad := range []string{"FATAL", "ERROR", "WARNING"} {
			if strings.Contains(line, bad) {
				return line
			}
		}
	}
	return ""
}
