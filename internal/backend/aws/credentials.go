package aws

import (
	"bufio"
	"bytes"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// SharedCredentials reads an access key from an AWS shared credentials
// file (its [default] profile: aws_access_key_id, aws_secret_access_key
// and, for temporary credentials, aws_session_token), the form
// Crossplane's AWS providers take from a Secret. Nothing else in the file
// is followed: no other profile, no credential_process (a program the
// provider would run), no role to assume.
func SharedCredentials(file []byte) (aws.CredentialsProvider, error) {
	vals := map[string]string{}
	profile := ""
	sc := bufio.NewScanner(bytes.NewReader(file))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			profile = strings.TrimSpace(line[1 : len(line)-1])
		case profile == "default":
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				return nil, errors.New("the AWS credentials file has a line that is no key = value in its [default] profile")
			}
			vals[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
		}
	}
	for _, k := range []string{"credential_process", "role_arn", "source_profile", "web_identity_token_file", "sso_start_url", "sso_session"} {
		if vals[k] != "" {
			return nil, errors.Errorf("the AWS credentials file sets %s, which the provider does not follow: give an access key (aws_access_key_id, aws_secret_access_key)", k)
		}
	}
	id, secret := vals["aws_access_key_id"], vals["aws_secret_access_key"]
	if id == "" || secret == "" {
		return nil, errors.New("the AWS credentials file has no [default] profile with aws_access_key_id and aws_secret_access_key")
	}
	return credentials.NewStaticCredentialsProvider(id, secret, vals["aws_session_token"]), nil
}
