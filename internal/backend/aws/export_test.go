package aws

// What Create refuses, for the external tests to compare errors with.
const (
	ErrFmtZoneOfOtherRegion = errFmtZoneOfOtherRegion
	ErrFmtUserDataTooLarge  = errFmtUserDataTooLarge
	ErrFmtUnknownParameter  = errFmtUnknownParameter
	ErrFmtImageOwner        = errFmtImageOwner
	ErrReadSubnet           = errReadSubnet
	ErrFmtSubnetZone        = errFmtSubnetZone
	IsFmtNotParameter       = isFmtNotParameter
	IsFmtNotImage           = isFmtNotImage
	MaxUserData             = maxUserData
	ErrFmtRetagged          = errFmtRetagged
)
