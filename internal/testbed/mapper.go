package testbed

import (
	"net/http"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// memoMapper remembers the mappings it found. A replica's cache in tests
// is scoped to the test's namespace (controller-runtime's multi-namespace
// cache), which asks the mapper whether the object is namespaced at every
// Get and List; the mapper's answer costs about 100 µs of CPU a call, which
// the cluster-wide cache the binaries run never pays. Remembered, a test's
// replica costs what a deployed one does (BenchmarkGateway measured the
// lookups, not the gateway). A kind's scope never changes, and only found
// mappings are kept, so a CRD installed later is still discovered.
type memoMapper struct {
	meta.RESTMapper
	found sync.Map // group/kind/versions -> *meta.RESTMapping
}

// newMemoMapper is the dynamic mapper controller-runtime builds by
// default, remembering what it found.
func newMemoMapper(cfg *rest.Config, hc *http.Client) (meta.RESTMapper, error) {
	m, err := apiutil.NewDynamicRESTMapper(cfg, hc)
	if err != nil {
		return nil, err
	}
	return &memoMapper{RESTMapper: m}, nil
}

func (m *memoMapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	key := gk.Group + "/" + gk.Kind + "/" + strings.Join(versions, ",")
	if v, ok := m.found.Load(key); ok {
		return v.(*meta.RESTMapping), nil
	}
	r, err := m.RESTMapper.RESTMapping(gk, versions...)
	if err == nil {
		m.found.Store(key, r)
	}
	return r, err
}
