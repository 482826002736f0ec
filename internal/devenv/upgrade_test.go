package devenv

import "testing"

// TestTagOf: the external runtime points a FunctionRevision at the process
// of its package's tag; a registry's port is no tag.
func TestTagOf(t *testing.T) {
	for ref, want := range map[string]string{
		"127.0.0.1:46005/kacerr/function-proxyfleet:v0.2.0":           "v0.2.0",
		"gitea.home.hrajfrisbee.cz/kacerr/function-proxyfleet:v0.1.0": "v0.1.0",
		"127.0.0.1:46005/kacerr/function-proxyfleet":                  "",
		"function-proxyfleet":                                         "",
	} {
		if got := tagOf(ref); got != want {
			t.Errorf("tagOf(%q) = %q, want %q", ref, got, want)
		}
	}
	if functionPorts(PackageVersion) != [2]string{"function", "function-metrics"} {
		t.Errorf("the function of %s must keep the port names make run saved: %v", PackageVersion, functionPorts(PackageVersion))
	}
	if a, b := functionPorts("v0.2.0"), functionPorts(PackageVersion); a[0] == b[0] || a[1] == b[1] {
		t.Errorf("two versions' functions run side by side during an upgrade and need ports of their own: %v and %v", a, b)
	}
}
