package discovery

import coordv1 "k8s.io/api/coordination/v1"

// coordLease is a Lease object.
type coordLease = coordv1.Lease
