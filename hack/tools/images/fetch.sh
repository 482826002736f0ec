#!/usr/bin/env bash
# Fetches, for each image family the cloud VM backends' generated start-up
# script supports, the packages that script installs (squid, with what it
# depends on) and base-passwd, as that release's archive has them today
# (its release, updates and security pockets: what apt-get install gets on
# a VM), and unpacks them into <dest>/<family>/: the family's own file
# layout, and a Squid that runs from there through its own loader and
# libraries. The tests in internal/backend/cloudvm check the script against
# each one (TestScriptOnEachFamily), so that the families accepted are the
# families tested.
#
# apt-get does the fetching, in a root of its own (the host's package state
# is not touched), and checks each archive's signature, insecure
# repositories refused whatever the host's apt.conf says: Debian's against
# the host's debian-archive-keyring, Ubuntu's against its 2018 archive key
# (ubuntu-archive-2018.asc here: "Ubuntu Archive Automatic Signing Key
# (2018)", F6EC B376 2474 EDA9 D21B  7022 8719 20D1 991B C93C). What the
# maintainer scripts would do is not done, but for the alternatives they
# install (Debian 13's /usr/sbin/squid is one, to squid-gnutls): those
# links are made as dpkg would make them.
#
# Usage: fetch.sh <dest> [family...]; a family already fetched is skipped
# (remove <dest>/<family> to fetch its newest packages). Families are
# fetched three at a time (the archives, not the CPU, are the limit);
# about 90 MB each once unpacked.
set -euo pipefail
if [ "${BASH_VERSINFO[0]}" -lt 5 ] || { [ "${BASH_VERSINFO[0]}" -eq 5 ] && [ "${BASH_VERSINFO[1]}" -lt 1 ]; }; then
	echo "fetch.sh needs bash 5.1 or later (wait -n -p); this is $BASH_VERSION" >&2
	exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
dest=$1
shift
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)

# family, archive, suite, security archive. Keep in step with
# cloudvm.Families.
families=(
	"debian-12 http://deb.debian.org/debian bookworm http://deb.debian.org/debian-security"
	"debian-13 http://deb.debian.org/debian trixie http://deb.debian.org/debian-security"
	"ubuntu-2204 http://archive.ubuntu.com/ubuntu jammy http://security.ubuntu.com/ubuntu"
	"ubuntu-2404 http://archive.ubuntu.com/ubuntu noble http://security.ubuntu.com/ubuntu"
	"ubuntu-2604 http://archive.ubuntu.com/ubuntu resolute http://security.ubuntu.com/ubuntu"
)

ubuntuKey=$here/ubuntu-archive-2018.asc
debianKey=/usr/share/keyrings/debian-archive-keyring.gpg

# fetch runs in a process of its own (see the loop below), where set -e
# holds: any failed step ends it without marking the family fetched.
fetch() { # family archive suite security
	local family=$1 archive=$2 suite=$3 security=$4 key start=$SECONDS
	local root=$dest/$family
	case $family in
	debian-*) key=$debianKey ;;
	ubuntu-*) key=$ubuntuKey ;;
	esac
	[ -f "$key" ] || { echo "$key is missing: apt-get install debian-archive-keyring" >&2; return 1; }
	echo ">> fetching squid of $family ($suite) from $archive"
	local tmp=$dest/.$family.tmp
	rm -rf "$tmp"
	mkdir -p "$tmp"/etc/apt/apt.conf.d "$tmp"/etc/apt/preferences.d "$tmp"/etc/apt/sources.list.d \
		"$tmp"/var/lib/apt/lists/partial "$tmp"/var/cache/apt/archives/partial "$tmp"/var/lib/dpkg
	: >"$tmp"/var/lib/dpkg/status
	{
		echo "deb [arch=amd64 signed-by=$key] $archive $suite main"
		echo "deb [arch=amd64 signed-by=$key] $archive $suite-updates main"
		echo "deb [arch=amd64 signed-by=$key] $security $suite-security main"
	} >"$tmp"/etc/apt/sources.list
	# apt reads only this configuration: the host's apt.conf and
	# apt.conf.d (which could relax signature checks or run hooks) are
	# not read.
	echo "Dir \"$tmp/\";" >"$tmp/apt.conf"
	export APT_CONFIG=$tmp/apt.conf
	local apt=(apt-get -q -o Dir="$tmp" -o Dir::State::status="$tmp"/var/lib/dpkg/status
		-o Dir::Bin::dpkg=/usr/bin/dpkg -o Dir::Etc::trustedparts=/nonexistent
		-o Acquire::AllowInsecureRepositories=false -o APT::Get::AllowUnauthenticated=false
		-o APT::Architecture=amd64 -o APT::Architectures::=amd64 -o Debug::NoLocking=1
		-o APT::Install-Recommends=false -o APT::Sandbox::User=root)
	"${apt[@]}" update >"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log" >&2; return 1; }
	"${apt[@]}" install -y --download-only squid base-passwd >>"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log" >&2; return 1; }
	mkdir -p "$tmp/fs"
	local deb link path
	for deb in "$tmp"/var/cache/apt/archives/*.deb; do
		dpkg-deb -x "$deb" "$tmp/fs"
		rm -rf "$tmp/ctl"
		dpkg-deb -e "$deb" "$tmp/ctl"
		# update-alternatives --install <link> <name> <path> <priority>
		if [ -f "$tmp/ctl/postinst" ]; then
			while read -r _ _ link _ path; do
				[ -e "$tmp/fs$link" ] || [ -L "$tmp/fs$link" ] ||
					ln -s "$(realpath -m -s --relative-to="$(dirname "$link")" "$path")" "$tmp/fs$link"
			done < <(grep -oE 'update-alternatives --install +[^ ]+ +[^ ]+ +[^ ]+' "$tmp/ctl/postinst" || true)
		fi
	done
	# What the tests read is the layout, the binaries and their libraries.
	rm -rf "$tmp"/fs/usr/share/{doc,man,locale,info,lintian,perl*} "$tmp"/fs/usr/lib/x86_64-linux-gnu/perl*
	# A tree is complete when its Squid and its loader are there.
	[ -e "$tmp/fs/usr/sbin/squid" ] || { echo "$family: no /usr/sbin/squid in the unpacked packages" >&2; return 1; }
	[ -e "$tmp/fs/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" ] || [ -e "$tmp/fs/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" ] ||
		{ echo "$family: no loader in the unpacked packages" >&2; return 1; }
	rm -rf "$root"
	mv "$tmp/fs" "$root"
	rm -rf "$tmp"
	touch "$root/.fetched"
	echo ">> $family fetched in $((SECONDS - start))s ($(du -sh "$root" | cut -f1))"
}

want=("$@")
for w in "${want[@]}"; do
	known=0
	for f in "${families[@]}"; do
		[ "${f%% *}" = "$w" ] && known=1
	done
	[ $known = 1 ] || { echo "unknown family $w" >&2; exit 2; }
done
declare -A running=()
failed=0
reap() { # waits for one fetch to end
	local pid=
	wait -n -p pid "${!running[@]}" || { [ -n "$pid" ] && echo "cannot fetch the packages of ${running[$pid]}" >&2; failed=1; }
	if [ -z "$pid" ]; then
		# No status came back for any of them: wait for each.
		for pid in "${!running[@]}"; do
			wait "$pid" || { echo "cannot fetch the packages of ${running[$pid]}" >&2; failed=1; }
		done
		running=()
		return
	fi
	unset "running[$pid]"
}
for f in "${families[@]}"; do
	read -r family archive suite security <<<"$f"
	if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " == *" $family "* ]]; then
		continue
	fi
	[ -f "$dest/$family/.fetched" ] && continue
	# In the background, set -e holds inside fetch (it would not on the
	# left of || or in an if).
	fetch "$family" "$archive" "$suite" "$security" &
	running[$!]=$family
	while [ ${#running[@]} -ge 3 ]; do reap; done
done
while [ ${#running[@]} -gt 0 ]; do reap; done
exit $failed
