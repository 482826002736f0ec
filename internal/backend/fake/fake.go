// Package fake is a hand-written in-memory Backend for unit tests. It counts
// calls, so tests can prove the reconciler never loops on a backend.
package fake

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
)

// Backend is an in-memory backend.
type Backend struct {
	mu        sync.Mutex
	instances map[string]backend.Instance

	// CreateErr, GetErr, DeleteErr and ListErr, when set, are returned by
	// every call.
	CreateErr, GetErr, DeleteErr, ListErr error
	// Host is given to created instances; empty means 127.0.0.1.
	Host string
	// Phase is given to created instances; empty means Running.
	Phase v1alpha1.InstancePhase
	// Now stamps CreatedAt; nil means time.Now.
	Now func() time.Time

	// Linger is how many Gets a deleted instance is still seen, Terminated,
	// as a VM being deleted keeps its name for a while; zero means none.
	Linger int

	// Calls counts calls by method name.
	Calls map[string]int

	lingering map[string]int
}

// New returns an empty fake backend.
func New() *Backend {
	return &Backend{instances: map[string]backend.Instance{}, Calls: map[string]int{}}
}

var _ backend.Backend = &Backend{}

func (b *Backend) count(m string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.Calls[m]++
}

// Create records an instance.
func (b *Backend) Create(_ context.Context, s backend.Spec) (*backend.Instance, error) {
	b.count("Create")
	if b.CreateErr != nil {
		return nil, b.CreateErr
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, deleting := b.lingering[s.Name]; deleting {
		return nil, backend.Errorf(backend.ClassTransient, "instance %s is still being deleted", s.Name)
	}
	if i, ok := b.instances[s.Name]; ok {
		return &i, nil
	}
	now := time.Now
	if b.Now != nil {
		now = b.Now
	}
	host, phase := b.Host, b.Phase
	if host == "" {
		host = "127.0.0.1"
	}
	if phase == "" {
		phase = v1alpha1.InstancePhaseRunning
	}
	i := backend.Instance{
		Ref: s.Ref, ProviderID: fmt.Sprintf("fake/%s", s.Name), Host: host, Port: s.Port,
		Phase: phase, CreatedAt: now(), SpecHash: s.Hash, CredentialsSum: s.CredentialsSum, Owner: s.Owner,
	}
	b.instances[s.Name] = i
	return &i, nil
}

// Get returns a recorded instance.
func (b *Backend) Get(_ context.Context, r backend.Ref) (*backend.Instance, error) {
	b.count("Get")
	if b.GetErr != nil {
		return nil, b.GetErr
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	i, ok := b.instances[r.Name]
	if !ok {
		return nil, backend.Errorf(backend.ClassNotFound, "instance %s not found", r.Name)
	}
	if left, deleting := b.lingering[r.Name]; deleting {
		if left <= 1 {
			delete(b.lingering, r.Name)
			delete(b.instances, r.Name)
		} else {
			b.lingering[r.Name] = left - 1
		}
		i.Phase, i.Host = v1alpha1.InstancePhaseTerminated, ""
	}
	return &i, nil
}

// Delete forgets an instance.
func (b *Backend) Delete(_ context.Context, r backend.Ref) error {
	b.count("Delete")
	if b.DeleteErr != nil {
		return b.DeleteErr
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.instances[r.Name]; ok && b.Linger > 0 {
		if _, deleting := b.lingering[r.Name]; !deleting {
			if b.lingering == nil {
				b.lingering = map[string]int{}
			}
			b.lingering[r.Name] = b.Linger
		}
		return nil
	}
	delete(b.instances, r.Name)
	return nil
}

// ListOwned lists every instance, by name.
func (b *Backend) ListOwned(_ context.Context) ([]backend.Instance, error) {
	b.count("ListOwned")
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ListErr != nil {
		return nil, b.ListErr
	}
	out := make([]backend.Instance, 0, len(b.instances))
	for _, i := range b.instances {
		out = append(out, i)
	}
	sort.Slice(out, func(a, c int) bool { return out[a].Name < out[c].Name })
	return out, nil
}

// Put stores an instance as it is, for tests that need a given state.
func (b *Backend) Put(i backend.Instance) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.instances[i.Name] = i
}

// CallCount returns how often a method was called.
func (b *Backend) CallCount(method string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.Calls[method]
}

// Rotating is a fake backend that changes credentials in place, as the
// local and pod backends do; the plain Backend cannot, as GCP cannot.
type Rotating struct {
	*Backend
	// Untils records the deadline each rotation set (zero when one
	// retired the previous credentials).
	Untils []time.Time
	// RotateErr, when set, is returned by every RotateCredentials.
	RotateErr error
}

var _ backend.CredentialRotator = &Rotating{}

// RotateCredentials rotates or retires as backend.CredentialRotator says,
// on the instance's recorded sum and deadline.
func (b *Rotating) RotateCredentials(_ context.Context, s backend.Spec, previousUntil, now time.Time) (backend.Rotation, error) {
	b.count("RotateCredentials")
	var r backend.Rotation
	if b.RotateErr != nil {
		return r, b.RotateErr
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	i, ok := b.instances[s.Name]
	if !ok {
		return r, backend.Errorf(backend.ClassNotFound, "instance %s not found", s.Name)
	}
	switch {
	case i.CredentialsSum != s.CredentialsSum:
		b.Untils = append(b.Untils, previousUntil)
		i.CredentialsSum, i.PreviousCredentialsUntil = s.CredentialsSum, previousUntil
		r.Rotated = true
	case !i.PreviousCredentialsUntil.IsZero() && !now.Before(i.PreviousCredentialsUntil):
		b.Untils = append(b.Untils, time.Time{})
		i.PreviousCredentialsUntil = time.Time{}
		r.Retired = true
	}
	r.PreviousUntil = i.PreviousCredentialsUntil
	b.instances[s.Name] = i
	return r, nil
}
