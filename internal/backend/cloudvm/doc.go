// Package cloudvm is what the cloud VM backends (gcp, aws) share: the
// start-up script that installs Squid on a Debian or Ubuntu image and runs
// it with the generated configuration, the releases it supports, and the
// rules by which a proxy's network opening (a GCP firewall rule, an EC2
// security group) is derived from its source ranges and shared by its
// fleet, what an instance records of itself and reads back, how an
// instance changes owner (an import) or is marked to outlive its Proxy,
// which openings no instance uses any more, and how a failed listing of
// the openings bears on the orphan collector's list. Each cloud's package
// is a client of its API behind these; cloudvmtest.Contract is what every
// one of them keeps.
//
// Files: script.go, the start-up script; family.go, the releases it
// supports, which each cloud's image check accepts and
// TestScriptOnEachFamily proves against the releases' own packages;
// network.go, the opening's ranges and the name a fleet's shared opening
// derives from them; keys.go, the labels or tags an instance records
// itself by; own.go, the owner labels an import writes, the retain mark,
// and the openings no listed instance uses; collect.go, the listing of
// instances and unused openings for the orphan collector.
//
// # A third cloud
//
// A cloud (Azure, a VPS provider) is a package of its own that implements
// backend.Backend (and Repairer, Adopter, Retainer where it can) with:
//   - a Cloud naming its placement and opening fields, for the shared
//     errors, and SourceRanges for what its opening admits;
//   - Keys naming its labels or tags, Record on create and Observe on
//     every observation;
//   - Script with its own own_addresses shell function (how a VM learns
//     its external addresses from the cloud's metadata service);
//   - an image check that accepts only Families (UnsupportedImage
//     otherwise), unless the Proxy brings its own start-up configuration;
//   - a Classify that sorts its API's errors into backend's classes;
//   - Adopted and Retained for imports and the retain mark, Used and
//     Unused for the openings the orphan collector takes, OpeningsUnlisted
//     and WithOpenings for ListOwned;
//   - a fake of its API behind its real client, and TestContract running
//     cloudvmtest.Contract against it.
//
// The controller then needs its ProviderConfig settings, a choice per
// placement field in its policy (internal/controller/proxy/policy.go) and
// a build function for Backends.cloudBackend.
//
// # Where the clouds differ
//
// What stays in each cloud's package is what its API makes different:
//   - Long operations. GCP answers an insert with an operation, waited for
//     briefly and handed off to the next observation
//     (backend.OperationChecker); EC2 answers at once and makes a create
//     safe to repeat with a ClientToken, chained when a token was spent on
//     an instance since terminated.
//   - Openings. A GCP firewall rule is updated in place when the fleet's
//     ranges change (Repairer); an EC2 security group's rules are
//     authorized once, and a change of ranges is a group of another name.
//   - Names. A GCP VM is named by the Proxy (ownership.InstanceName), so a
//     second create of the name is refused by GCP itself; an EC2 instance
//     is i-..., found by its Name tag, and EC2's listing lags a launch
//     (backend.Lagging), so the backend keeps a shared listing and
//     terminates an older instance of the same name.
//   - Labels. GCP labels are lowercase words of at most 63 characters and
//     are set as a whole under a fingerprint (a compare-and-swap); EC2
//     tags are set and deleted one by one, and read back.
//   - Listing. GCP lists every zone at once and reports a zone it cannot
//     reach as a scope warning; EC2 lists a region, by tag filters.
package cloudvm
