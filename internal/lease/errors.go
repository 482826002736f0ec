package lease

// Error messages, compared by callers and tests as constants.
const (
	errCreateLease      = "cannot create lease"
	errGetLease         = "cannot get lease"
	errReplaceExpired   = "cannot replace expired lease"
	errRecordBan        = "cannot record ban"
	errGetBan           = "cannot get ban"
	errExtendBan        = "cannot extend ban"
	errLiftBan          = "cannot lift ban"
	errRecordIPBan      = "cannot record the ban in its IP's history"
	errLiftIPBan        = "cannot lift the ban in its IP's history"
	errListBans         = "cannot list bans"
	errListBanHistories = "cannot list ban histories"
	errRenewLease       = "cannot renew lease"
	errReleaseLease     = "cannot release lease"
	errListLeases       = "cannot list leases"
	errChangedEveryTry  = "it changed under every try"
)

// Error formats.
const (
	errFmtIndexBy       = "cannot index leases by %s"
	errFmtSweepLease    = "cannot sweep lease %s/%s"
	errFmtNotBanHistory = "Lease %s/%s is not the ban history of %s in fleet %s: delete or rename it"
	errFmtLeaseID       = "leaseID %q is not <namespace>/<name>/<token>"
)
