package aws

// What Create refuses, for the external tests to compare errors with.
const (
	ErrFmtZoneOfOtherRegion = errFmtZoneOfOtherRegion
	ErrFmtUserDataTooLarge  = errFmtUserDataTooLarge
	ErrFmtUnknownParameter  = errFmtUnknownParameter
	ErrFmtImageOwner        = errFmtImageOwner
	ErrReadSubnet           = errReadSubnet
	ErrFmtSubnetZone        = errFmtSubnetZone
	IsNotParameter          = isNotParameter
	IsNotImage              = isNotImage
	MaxUserData             = maxUserData
	ErrFmtRetagged          = errFmtRetagged
)
