package lease

import (
	"context"
	"time"
)

// SetExpiryMargin makes s take expired slots over margin past their TTL,
// rather than ExpiryMargin, so that fault tests see many takeovers.
func SetExpiryMargin(s *Store, margin time.Duration) { s.margin = margin }

// Unguarded makes s the broken store the fault tests' checker must catch:
// it takes expired slots over without the UID and resourceVersion
// preconditions, gap after reading them.
func Unguarded(s *Store, gap time.Duration) { s.unguarded, s.unguardedGap = true, gap }

// Indexed says whether s reads its cache's Lease indexes in namespace.
func Indexed(ctx context.Context, s *Store, namespace string) bool { return s.indexed(ctx, namespace) }
