package gcp

// The messages adoptVM formats, for the external tests to compare errors
// with.
const (
	ErrFmtNameHeldByOther = errFmtNameHeldByOther
	ErrFmtStillDeleting   = errFmtStillDeleting
	ErrFmtEarlierSpec     = errFmtEarlierSpec
)

// What Create refuses of a VM's network, for the external tests.
const (
	ErrFmtSubnetworkProject = errFmtSubnetworkProject
	ErrFmtNoExternalIPGrant = errFmtNoExternalIPGrant
	PermUseExternalIP       = permUseExternalIP
	IsFmtNotImage           = isFmtNotImage
)
