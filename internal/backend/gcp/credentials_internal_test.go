package gcp

import (
	"encoding/json"
	"fmt"
	"testing"

	"google.golang.org/api/option"
)

// TestServiceAccountKey: a tenant's key must be a service-account key, and it goes to
// the client rebuilt with Google's token URI, whatever its own says, so it
// cannot make the provider send its signed JWT elsewhere.
func TestServiceAccountKey(t *testing.T) {
	evil := `{"type": "service_account", "client_email": "x@p.iam.gserviceaccount.com", "private_key": "k", "token_uri": "http://127.0.0.1:8080/metrics", "universe_domain": "evil"}`
	typ, key, err := serviceAccountKey([]byte(evil), true)
	if err != nil || typ != "service_account" {
		t.Fatalf("a tenant's service-account key: %v %v", typ, err)
	}
	var got map[string]any
	if err := json.Unmarshal(key, &got); err != nil {
		t.Fatal(err)
	}
	if got["token_uri"] != googleTokenURI || got["universe_domain"] != nil {
		t.Errorf("a tenant's key keeps only what a key needs, with Google's token URI: %v", got)
	}
	if _, key, _ := serviceAccountKey([]byte(evil), false); string(key) != evil {
		t.Error("the platform's key is used as it is")
	}
	for _, k := range []string{`{"type": "external_account", "credential_source": {"file": "/etc/hostname"}}`, `{"type": "authorized_user"}`, `not json`} {
		if _, _, err := serviceAccountKey([]byte(k), true); err == nil {
			t.Errorf("a tenant's %s must be refused", k)
		}
	}
	if _, _, err := serviceAccountKey([]byte(`{"type": "external_account", "credential_source": {"file": "/etc/hostname"}}`), false); err == nil || err.Error() != fmt.Sprintf(errFmtKeyType, "external_account", option.ServiceAccount) {
		t.Errorf("an external-account file is refused for the platform too (workload identity is InjectedIdentity): %v", err)
	}
}
