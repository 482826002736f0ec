package allocator

import (
	"context"
	"sync"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
)

// refusalWindow is how far back refused acquisitions count as demand.
const refusalWindow = time.Minute

// maxRefusalsKept bounds the crawlers remembered as refused per fleet:
// past it, more refusals ask for no more proxies than a fleet's
// maxReplicas allows anyway.
const maxRefusalsKept = 4096

// refusedHoldersWithoutQuota is how many holders an identity without a
// lease quota counts for as refused demand: without it, one caller naming
// a new holder per request would ask for maxReplicas. A crawler team with
// more workers under one identity gives it a quota (or its workers wait,
// which counts each waiter).
const refusedHoldersWithoutQuota = 16

// refusals remembers, per fleet, which crawlers (an identity and each
// holder it named) were refused a lease for want of a slot or of healthy
// proxies, and when last, for the demand this replica publishes. A crawler
// counts once however often it asks again, and an identity for no more
// holders than its lease quota lets it hold: retries, and holder names
// made up per request, are no more demand.
type refusals struct {
	mu sync.Mutex
	at map[string]map[string]*refusedIdentity
	n  map[string]int
}

type refusedIdentity struct {
	quota   int // 0: none
	holders map[string]time.Time
}

// limit is how many holders the identity counts for.
func (ri *refusedIdentity) limit() int {
	if ri.quota > 0 {
		return ri.quota
	}
	return refusedHoldersWithoutQuota
}

// record notes that identity, as holder, was refused a lease of fleet key
// at now; quota is the identity's lease bound in the fleet (0: none).
func (r *refusals) record(key, identity, holder string, quota int, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.at == nil {
		r.at, r.n = map[string]map[string]*refusedIdentity{}, map[string]int{}
	}
	ids := r.at[key]
	if ids == nil {
		ids = map[string]*refusedIdentity{}
		r.at[key] = ids
	}
	ri := ids[identity]
	if ri == nil {
		ri = &refusedIdentity{holders: map[string]time.Time{}}
		ids[identity] = ri
	}
	ri.quota = quota
	if _, ok := ri.holders[holder]; !ok {
		// Past what it may count for, an identity's holders are not kept
		// either: it cannot crowd out the others' refusals.
		if r.n[key] >= maxRefusalsKept || len(ri.holders) >= ri.limit() {
			return
		}
		r.n[key]++
	}
	ri.holders[holder] = now
}

// count is how many crawlers were refused a lease of fleet key within the
// last minute before now, each identity counted for at most its quota (or
// refusedHoldersWithoutQuota); it
// forgets those refused earlier.
func (r *refusals) count(key string, now time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	total := 0
	for id, ri := range r.at[key] {
		for h, at := range ri.holders {
			if !at.After(now.Add(-refusalWindow)) {
				delete(ri.holders, h)
				r.n[key]--
			}
		}
		n := len(ri.holders)
		if n == 0 {
			delete(r.at[key], id)
			continue
		}
		total += min(n, ri.limit())
	}
	if len(r.at[key]) == 0 {
		delete(r.at, key)
		delete(r.n, key)
	}
	return total
}

// DemandOf is this replica's share of a fleet's demand now: the leases held
// (as its cache shows them, for the status page; the function counts them
// from the slots itself), the acquisitions waiting on it, and those it
// refused within the last minute.
func (s *Allocator) DemandOf(ctx context.Context, ns, fleet string) (leasewire.Demand, error) {
	slots, err := s.Leases.Slots(ctx, ns, fleet)
	if err != nil {
		return leasewire.Demand{}, err
	}
	held := 0
	for _, ls := range slots {
		held += len(ls)
	}
	return s.DemandWith(ns, fleet, held), nil
}

// DemandWith is DemandOf for a caller that counted the fleet's live slots
// already (held), so that they are not read twice.
func (s *Allocator) DemandWith(ns, fleet string, held int) leasewire.Demand {
	return leasewire.Demand{Held: held, Waiting: s.queues.fleetDepth(ns, fleet), Refused: s.refused.count(ns+"/"+fleet, s.Now())}
}
