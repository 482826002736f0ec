package gcp

import (
	"encoding/json"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"google.golang.org/api/option"
)

// ServiceAccountKey is the client option that authenticates with a
// service-account key read from a ProviderConfig's Secret; tenant says
// the configuration is a namespaced ProviderConfig's (see
// serviceAccountKey).
func ServiceAccountKey(key []byte, tenant bool) (option.ClientOption, error) {
	typ, key, err := serviceAccountKey(key, tenant)
	if err != nil {
		return nil, err
	}
	return option.WithAuthCredentialsJSON(typ, key), nil
}

// googleTokenURI is where a service-account key's JWT is exchanged.
const googleTokenURI = "https://oauth2.googleapis.com/token"

// errFmtKeyType refuses credentials other than a service-account key:
// their type, the key's.
const errFmtKeyType = "the GCP credentials are of type %q: spec.gcp.credentials takes only a service-account key (type %q); for workload identity use source InjectedIdentity on a ClusterProviderConfig"

// serviceAccountKey reads a GCP credentials file and returns its type and the key to
// use. It must be a service-account key: the other kinds (external
// accounts above all) make the provider read files, run programs or send
// requests where their author chose, and the client library does not check
// the declared type on every path. A tenant's (a namespaced
// ProviderConfig's) key is rebuilt from the fields a key needs, with
// Google's token URI, so that its own token_uri cannot send the provider's
// requests to the metadata server or the provider's own endpoints.
func serviceAccountKey(key []byte, tenant bool) (option.CredentialsType, []byte, error) {
	var f struct {
		Type         string `json:"type"`
		ProjectID    string `json:"project_id,omitempty"`
		PrivateKeyID string `json:"private_key_id,omitempty"`
		PrivateKey   string `json:"private_key"`
		ClientEmail  string `json:"client_email"`
		ClientID     string `json:"client_id,omitempty"`
		TokenURI     string `json:"token_uri"`
	}
	if err := json.Unmarshal(key, &f); err != nil {
		return "", nil, errors.New("the GCP credentials are not JSON")
	}
	t := option.CredentialsType(f.Type)
	switch {
	case t == option.ServiceAccount && tenant:
		f.TokenURI = googleTokenURI
		clean, err := json.Marshal(f)
		return t, clean, errors.Wrap(err, "cannot rebuild the service-account key")
	case t == option.ServiceAccount:
		return t, key, nil
	default:
		return "", nil, errors.Errorf(errFmtKeyType, f.Type, option.ServiceAccount)
	}
}
