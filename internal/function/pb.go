package function

import (
	"encoding/json"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"google.golang.org/protobuf/types/known/structpb"
)

// The function reads and writes the request's protobuf Structs directly. The
// SDK's conversions go through JSON for every resource, which for a fleet
// of thousands of proxies cost more than all of the function's own work.

// field walks a Struct along path; nil when any step is missing.
func field(s *structpb.Struct, path ...string) *structpb.Value {
	var v *structpb.Value
	for i, p := range path {
		if s == nil {
			return nil
		}
		v = s.GetFields()[p]
		if i < len(path)-1 {
			s = v.GetStructValue()
		}
	}
	return v
}

func str(s *structpb.Struct, path ...string) string { return field(s, path...).GetStringValue() }

// toValue converts a JSON-marshalable Go value into a protobuf Value.
func toValue(v any) (*structpb.Value, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, errors.Wrap(err, "cannot encode")
	}
	var m any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, errors.Wrap(err, "cannot decode")
	}
	return structpb.NewValue(m)
}

func strings2struct(m map[string]string) *structpb.Struct {
	s := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(m))}
	for k, v := range m {
		s.Fields[k] = structpb.NewStringValue(v)
	}
	return s
}
