package aws

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
)

// encodedMarker precedes the encoded message in an UnauthorizedOperation.
const encodedMarker = "Encoded authorization failure message: "

// decoded is what sts:DecodeAuthorizationMessage says of a refusal.
type decoded struct {
	Allowed      bool `json:"allowed"`
	ExplicitDeny bool `json:"explicitDeny"`
	Context      struct {
		Principal struct {
			ARN string `json:"arn"`
		} `json:"principal"`
		Action   string `json:"action"`
		Resource string `json:"resource"`
	} `json:"context"`
}

// explain replaces, in an UnauthorizedOperation, EC2's encoded message (a
// long opaque blob) with what it says: the action, the resource and the
// principal refused, and whether a policy denied it explicitly, decoded
// through sts:DecodeAuthorizationMessage. Without that permission it says
// which permission would tell. Its class stays AccessDenied; other errors
// pass unchanged.
func (b *Backend) explain(ctx context.Context, err error) error {
	if err == nil || code(err) != "UnauthorizedOperation" {
		return err
	}
	msg := err.Error()
	i := strings.Index(msg, encodedMarker)
	if i < 0 {
		return err
	}
	enc := msg[i+len(encodedMarker):]
	if j := strings.IndexAny(enc, " \n\t"); j >= 0 {
		enc = enc[:j]
	}
	why := "its reason is encoded: grant the provider's identity sts:DecodeAuthorizationMessage to have it here"
	var d decoded
	if b.decode(ctx, enc, &d) {
		deny := "no policy allows it"
		if d.ExplicitDeny {
			deny = "a policy denies it explicitly"
		}
		why = fmt.Sprintf("%s may not %s on %s: %s", d.Context.Principal.ARN, d.Context.Action, d.Context.Resource, deny)
	}
	return backend.Wrap(backend.ClassOf(err), errors.New(msg[:i]+why))
}

// decodeRefusedFor is how long, after STS refused a decode, none is asked
// for: a Proxy refused at every observation would otherwise cost an STS
// call (and an AccessDenied in CloudTrail) each time.
const decodeRefusedFor = 10 * time.Minute

// decode asks STS what enc says, once, within 5 s; false when it cannot.
func (b *Backend) decode(ctx context.Context, enc string, into *decoded) bool {
	b.decodeMu.Lock()
	refused := b.cfg.Now().Before(b.decodeRefusedUntil)
	b.decodeMu.Unlock()
	if refused {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := b.sts.DecodeAuthorizationMessage(ctx, &sts.DecodeAuthorizationMessageInput{EncodedMessage: aws.String(enc)},
		func(o *sts.Options) { o.RetryMaxAttempts = 1 })
	if err != nil {
		if code(err) == "AccessDenied" {
			b.decodeMu.Lock()
			b.decodeRefusedUntil = b.cfg.Now().Add(decodeRefusedFor)
			b.decodeMu.Unlock()
		}
		return false
	}
	return json.Unmarshal([]byte(aws.ToString(out.DecodedMessage)), into) == nil && into.Context.Action != ""
}
