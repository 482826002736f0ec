package aws

import (
	"context"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// DefaultListingMaxAge is how old a listing of the cluster's instances may
// be when a Get answers from it.
const DefaultListingMaxAge = 10 * time.Second

// settle is how long after a change of its own the backend still asks EC2
// of that name alone: EC2's listing may lag a change by a few seconds.
const settle = 5 * time.Second

// listing is one DescribeInstances listing of every instance this cluster
// made in the region, shared by the Gets of a poll: EC2 refills
// DescribeInstances at about 20 requests a second per account and region,
// so one listing a Proxy per poll throttles a fleet of a few thousand,
// while one listing of 1 000 instances a page every maxAge costs ten
// requests for 10 000 of them. A Get answers from it only for a name
// it lists that this backend has not changed since the listing began;
// a name it does not list (an instance too new for EC2's listing, or
// gone) and a name changed since are asked of EC2 alone, as before.
type listing struct {
	maxAge time.Duration
	now    func() time.Time
	list   func(ctx context.Context) ([]types.Instance, error)

	mu       sync.Mutex
	started  time.Time                   // when the listing in hand began
	finished time.Time                   // and when it ended
	failed   time.Time                   // when the last listing failed
	byName   map[string][]types.Instance // the listing in hand, by name
	names    map[string]string           // the listing in hand: instance ID -> name
	running  *listCall                   // the listing under way, if any
	changed  map[string]time.Time        // names this backend changed, and when
}

// listCall is a listing under way, which the Gets that need it wait for.
type listCall struct {
	done    chan struct{}
	started time.Time
	byName  map[string][]types.Instance
	names   map[string]string
	err     error
}

func newListing(maxAge time.Duration, now func() time.Time, list func(ctx context.Context) ([]types.Instance, error)) *listing {
	if maxAge <= 0 {
		maxAge = DefaultListingMaxAge
	}
	return &listing{maxAge: maxAge, now: now, list: list, changed: map[string]time.Time{}}
}

// touch records that this backend changed name's instances (launched,
// terminated or retagged one): a listing begun before then is not
// trusted for it.
func (l *listing) touch(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.changed[name] = l.now()
}

// instances are name's instances as a listing no older than maxAge shows
// them, and true; false when the listing cannot answer for name (it does
// not list it, this backend changed it since, or the listing failed).
func (l *listing) instances(ctx context.Context, name string) ([]types.Instance, bool) {
	started, byName, err := l.current(ctx)
	if err != nil {
		return nil, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if t, ok := l.changed[name]; ok && started.Before(t.Add(settle)) {
		return nil, false
	}
	all, ok := byName[name]
	return all, ok
}

// name is the name of the instance of id, as the listing shows it.
func (l *listing) name(ctx context.Context, id string) (string, bool) {
	if _, _, err := l.current(ctx); err != nil {
		return "", false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n, ok := l.names[id]
	return n, ok
}

// known is the name of the instance of id in the listing in hand, if any,
// without listing.
func (l *listing) known(id string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.names[id]
}

// maxWait is the longest a Get waits for a listing under way before it
// asks EC2 of its name alone: a listing of 10 000 instances takes ten
// pages, seconds, which no observation should wait out.
const maxWait = time.Second

// current is a listing to answer from: the one in hand while it is
// trusted (until maxAge after it finished: what it says is at most its
// own duration plus maxAge old), else one under way or a new one, waited
// for at most maxWait. A listing in hand past half its trust starts the
// next in the background, so that a steady poll never waits; after a
// failed listing none starts for maxAge.
func (l *listing) current(ctx context.Context) (time.Time, map[string][]types.Instance, error) {
	l.mu.Lock()
	now := l.now()
	trusted := l.byName != nil && now.Sub(l.finished) <= l.maxAge
	if l.running == nil && now.Sub(l.failed) > l.maxAge && (!trusted || now.Sub(l.finished) > l.maxAge/2) {
		l.running = &listCall{done: make(chan struct{}), started: now}
		go l.run(l.running)
	}
	if trusted {
		started, byName := l.started, l.byName
		l.mu.Unlock()
		return started, byName, nil
	}
	c := l.running
	l.mu.Unlock()
	if c == nil {
		return time.Time{}, nil, errors.New("the last listing failed")
	}
	t := time.NewTimer(maxWait)
	defer t.Stop()
	select {
	case <-c.done:
		return c.started, c.byName, c.err
	case <-t.C:
		return time.Time{}, nil, errors.New("the listing under way takes a while")
	case <-ctx.Done():
		return time.Time{}, nil, ctx.Err()
	}
}

// run lists, on a context of its own (a Get that gave up waiting does not
// cut the listing short for the others), and keeps what it found.
func (l *listing) run(c *listCall) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	all, err := l.list(ctx)
	byName, names := map[string][]types.Instance{}, map[string]string{}
	for i := range all {
		if name := tagsOf(&all[i])[TagInstance]; name != "" {
			byName[name] = append(byName[name], all[i])
			names[aws.ToString(all[i].InstanceId)] = name
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	c.byName, c.names, c.err = byName, names, err
	if err != nil {
		l.failed = l.now()
	} else {
		l.started, l.finished, l.byName, l.names = c.started, l.now(), byName, names
		// Changes every listing from now on follows are forgotten.
		for name, t := range l.changed {
			if t.Add(settle).Before(c.started) {
				delete(l.changed, name)
			}
		}
	}
	l.running = nil
	close(c.done)
}

// listAll lists every instance this cluster made in the region, in every
// state EC2 still lists.
func (b *Backend) listAll(ctx context.Context) ([]types.Instance, error) {
	sel := ownership.Selector(b.cfg.ClusterID)
	if b.cfg.Namespace != "" {
		sel[ownership.LabelNamespace] = ownership.LabelValue(b.cfg.Namespace)
	}
	return b.describe(ctx, tagFilters(sel))
}

// tagFilters are EC2 filters selecting the resources tagged with all of
// sel, in a stable order.
func tagFilters(sel map[string]string) []types.Filter {
	filters := make([]types.Filter, 0, len(sel))
	for _, k := range sortedKeys(sel) {
		filters = append(filters, types.Filter{Name: aws.String("tag:" + k), Values: []string{sel[k]}})
	}
	return filters
}
