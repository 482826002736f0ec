package gcp

// The messages adoptVM formats, for the external tests to compare errors
// with.
const (
	ErrFmtNameHeldByOther = errFmtNameHeldByOther
	ErrFmtStillDeleting   = errFmtStillDeleting
	ErrFmtEarlierSpec     = errFmtEarlierSpec
)
