package ec2fake

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/xml"
	"net/http"
	"strings"
)

// STS's DecodeAuthorizationMessage, which the backend calls to say why EC2
// refused it: the fake keeps each encoded message it handed out (through
// EncodeAuthorization) and decodes it for a caller whose request is signed
// for STS, unless DenyDecode is set (the caller lacks
// sts:DecodeAuthorizationMessage).

const stsVersion = "2011-06-15"

// requestID is the request ID of every answer.
const requestID = "fake-request"

// EncodeAuthorization returns the encoded authorization failure message
// EC2 would put in an UnauthorizedOperation, whose decoding is decoded (a
// JSON document as STS returns it).
func (s *Server) EncodeAuthorization(decoded string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	sum := sha256.Sum256([]byte(decoded))
	// Long and opaque, as EC2's are.
	enc := strings.Repeat(base64.RawURLEncoding.EncodeToString(sum[:]), 20)
	if s.encoded == nil {
		s.encoded = map[string]string{}
	}
	s.encoded[enc] = decoded
	return enc
}

// Unauthorized is the failure EC2 answers a caller refused an action,
// with the encoded message of decoded.
func (s *Server) Unauthorized(decoded string) Failure {
	return Failure{Code: "UnauthorizedOperation", Status: http.StatusForbidden,
		Message: "You are not authorized to perform this operation. User: arn:aws:sts::123456789012:assumed-role/provider/i is not authorized to perform: ec2:RunInstances. Encoded authorization failure message: " + s.EncodeAuthorization(decoded)}
}

type xDecodeResponse struct {
	XMLName   xml.Name `xml:"DecodeAuthorizationMessageResponse"`
	Xmlns     string   `xml:"xmlns,attr"`
	Decoded   string   `xml:"DecodeAuthorizationMessageResult>DecodedMessage"`
	RequestID string   `xml:"ResponseMetadata>RequestId"`
}

type xSTSErrorResponse struct {
	XMLName   xml.Name `xml:"ErrorResponse"`
	Type      string   `xml:"Error>Type"`
	Code      string   `xml:"Error>Code"`
	Message   string   `xml:"Error>Message"`
	RequestID string   `xml:"RequestId"`
}

// serveSTS answers an STS call, signed for STS in the fake's region.
func (s *Server) serveSTS(w http.ResponseWriter, auth string, p map[string]string) {
	fail := func(status int, code, msg string) {
		w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
		w.WriteHeader(status)
		_ = xml.NewEncoder(w).Encode(xSTSErrorResponse{Type: "Sender", Code: code, Message: msg, RequestID: requestID})
	}
	if !strings.Contains(auth, "/"+Region+"/sts/aws4_request") {
		fail(http.StatusForbidden, "SignatureDoesNotMatch", "credential should be scoped to service sts")
		return
	}
	if p["Version"] != stsVersion || p["Action"] != "DecodeAuthorizationMessage" {
		fail(http.StatusBadRequest, "InvalidAction", "the fake's STS answers DecodeAuthorizationMessage of version "+stsVersion)
		return
	}
	s.mu.Lock()
	s.calls["sts:DecodeAuthorizationMessage"]++
	decoded, ok := s.encoded[p["EncodedMessage"]]
	deny := s.DenyDecode
	s.mu.Unlock()
	switch {
	case deny:
		fail(http.StatusForbidden, "AccessDenied", "User: arn:aws:sts::123456789012:assumed-role/provider/i is not authorized to perform: sts:DecodeAuthorizationMessage")
	case !ok:
		fail(http.StatusBadRequest, "InvalidAuthorizationMessageException", "The encoded message is not valid")
	default:
		w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
		_ = xml.NewEncoder(w).Encode(xDecodeResponse{Xmlns: "https://sts.amazonaws.com/doc/" + stsVersion + "/", Decoded: decoded, RequestID: requestID})
	}
}
