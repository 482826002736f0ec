package gcp

import (
	"context"
	"fmt"
	"strings"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"google.golang.org/api/googleapi"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
)

// wait waits for op with Compute Engine's own operations.wait, which holds
// the request until the operation is done (or answers early, with it still
// running: then it asks again), until limit passes or ctx ends, leaving a
// little of ctx for the caller to record the outcome. It reports whether op
// finished, and the error it finished with. A failure to wait only ends
// the wait: the operation goes on regardless, and a later look finds it.
func (b *Backend) wait(ctx context.Context, op *compute.Operation, limit time.Duration) (bool, error) {
	if op.Done() {
		return true, opError(op)
	}
	deadline := time.Now().Add(limit)
	if d, ok := ctx.Deadline(); ok && d.Add(-5*time.Second).Before(deadline) {
		deadline = d.Add(-5 * time.Second)
	}
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	project, zone := opScope(op.Proto(), b.cfg.Project)
	for {
		var got *computepb.Operation
		var err error
		if zone != "" {
			got, err = b.ops.Wait(wctx, &computepb.WaitZoneOperationRequest{Project: project, Zone: zone, Operation: op.Name()})
		} else {
			got, err = b.globalOps.Wait(wctx, &computepb.WaitGlobalOperationRequest{Project: project, Operation: op.Name()})
		}
		switch {
		case err != nil && backend.ClassOf(Classify(err)) == backend.ClassAccessDenied && wctx.Err() == nil:
			// A standing refusal to read the operation (no
			// compute.zoneOperations.get or globalOperations.get, as in
			// a Shared VPC host project) is not "not done yet": it would
			// never be done.
			return false, errors.Wrapf(Classify(err), "cannot read operation %s (the service account needs compute.zoneOperations.get and compute.globalOperations.get in project %s)", op.Name(), project)
		case err != nil:
			return false, nil
		case got.GetStatus() == computepb.Operation_DONE:
			return true, protoError(got)
		}
		// Answered early, still running: ask again, not in a tight loop.
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-wctx.Done():
			t.Stop()
			return false, nil
		case <-t.C:
		}
	}
}

// opScope reads the project and zone (empty for a global operation) of an
// operation from its links, as GCP writes them.
func opScope(p *computepb.Operation, project string) (string, string) {
	link := p.GetSelfLink()
	if i := strings.Index(link, "/projects/"); i >= 0 {
		if name, _, ok := strings.Cut(link[i+len("/projects/"):], "/"); ok {
			project = name
		}
	}
	zone := p.GetZone()
	if i := strings.LastIndex(zone, "/"); i >= 0 {
		zone = zone[i+1:]
	}
	return project, zone
}

// opError is the error a finished operation reports, as the client
// library would return it from Poll.
func opError(op *compute.Operation) error { return protoError(op.Proto()) }

func protoError(p *computepb.Operation) error {
	if p.GetError() == nil && (p.HttpErrorStatusCode == nil || p.GetHttpErrorStatusCode() < 300) {
		return nil
	}
	var codes []string
	for _, e := range p.GetError().GetErrors() {
		codes = append(codes, e.GetCode()+": "+e.GetMessage())
	}
	return &googleapi.Error{Code: int(p.GetHttpErrorStatusCode()), Message: p.GetHttpErrorMessage() + ": " + strings.Join(codes, "; ")}
}

// CheckOperation reports how an insert Create left running ended: nil
// while it runs, when it succeeded or when GCP no longer knows it, else
// its error, classified.
func (b *Backend) CheckOperation(ctx context.Context, r backend.Ref, name string) error {
	op, err := b.ops.Get(ctx, &computepb.GetZoneOperationRequest{Project: b.cfg.Project, Zone: r.Zone, Operation: name})
	switch {
	case err != nil && backend.ClassOf(Classify(err)) == backend.ClassNotFound:
		return nil
	case err != nil:
		return errors.Wrapf(Classify(err), "cannot get operation %s", name)
	case op.GetStatus() != computepb.Operation_DONE:
		return nil
	}
	if err := protoError(op); err != nil {
		return insertError(err, fmt.Sprintf("inserting VM %s in zone %s failed (operation %s)", r.Name, r.Zone, name))
	}
	return nil
}
