#!/usr/bin/env bash
# Fetches, for each image family the cloud VM backends' generated start-up
# script supports, the packages that script installs (squid, with what it
# depends on) and base-passwd, as that release's archive has them, and
# unpacks them into <dest>/<family>/: the family's own file layout, and a
# Squid that runs from there through its own loader and libraries. The
# tests in internal/backend/cloudvm check the script against each one
# (TestScriptOnEachFamily), so that the families accepted are the families
# tested.
#
# apt-get does the fetching, in a root of its own (the host's package state
# is not touched), and checks each archive's signature: Debian's against
# the host's debian-archive-keyring, Ubuntu's against its 2018 archive key
# (ubuntu-archive-2018.asc here: "Ubuntu Archive Automatic Signing Key
# (2018)", F6EC B376 2474 EDA9 D21B  7022 8719 20D1 991B C93C). What the
# maintainer scripts would do is not done, but for the alternatives they
# install (Debian 13's /usr/sbin/squid is one, to squid-gnutls): those
# links are made as dpkg would make them.
#
# Usage: fetch.sh <dest> [family...]; a family already fetched is skipped.
# Families are fetched three at a time (the archives, not the CPU, are the
# limit); about 80 MB each once unpacked.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dest=$1
shift
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)

# family, archive, suite. Keep in step with cloudvm.Families.
families=(
	"debian-11 http://deb.debian.org/debian bullseye"
	"debian-12 http://deb.debian.org/debian bookworm"
	"debian-13 http://deb.debian.org/debian trixie"
	"ubuntu-2004 http://archive.ubuntu.com/ubuntu focal"
	"ubuntu-2204 http://archive.ubuntu.com/ubuntu jammy"
	"ubuntu-2404 http://archive.ubuntu.com/ubuntu noble"
	"ubuntu-2504 http://archive.ubuntu.com/ubuntu plucky"
	"ubuntu-2510 http://archive.ubuntu.com/ubuntu questing"
	"ubuntu-2604 http://archive.ubuntu.com/ubuntu resolute"
)

ubuntuKey=$here/ubuntu-archive-2018.asc
debianKey=/usr/share/keyrings/debian-archive-keyring.gpg

fetch() { # family archive suite
	local family=$1 archive=$2 suite=$3 key start=$SECONDS
	local root=$dest/$family
	[ -f "$root/.fetched" ] && return 0
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
	echo "deb [arch=amd64 signed-by=$key] $archive $suite main" >"$tmp"/etc/apt/sources.list
	local apt=(apt-get -q -o Dir="$tmp" -o Dir::State::status="$tmp"/var/lib/dpkg/status
		-o Dir::Bin::dpkg=/usr/bin/dpkg -o Dir::Etc::trustedparts=/nonexistent
		-o APT::Architecture=amd64 -o APT::Architectures::=amd64 -o Debug::NoLocking=1
		-o APT::Install-Recommends=false -o APT::Sandbox::User=root)
	"${apt[@]}" update >"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log" >&2; return 1; }
	"${apt[@]}" install -y --download-only squid base-passwd >>"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log" >&2; return 1; }
	mkdir -p "$tmp/fs"
	for deb in "$tmp"/var/cache/apt/archives/*.deb; do
		dpkg-deb -x "$deb" "$tmp/fs"
		rm -rf "$tmp/ctl"
		dpkg-deb -e "$deb" "$tmp/ctl"
		# update-alternatives --install <link> <name> <path> <priority>
		if [ -f "$tmp/ctl/postinst" ]; then
			{ grep -oE 'update-alternatives --install +[^ ]+ +[^ ]+ +[^ ]+' "$tmp/ctl/postinst" || true; } |
				while read -r _ _ link _ path; do
					[ -e "$tmp/fs$link" ] || ln -s "$(realpath -m --relative-to="$(dirname "$link")" "$path")" "$tmp/fs$link"
				done
		fi
	done
	# What the tests read is the layout, the binaries and their libraries.
	rm -rf "$tmp"/fs/usr/share/{doc,man,locale,info,lintian,perl*} "$tmp"/fs/usr/lib/x86_64-linux-gnu/perl*
	rm -rf "$root"
	mv "$tmp/fs" "$root"
	rm -rf "$tmp"
	touch "$root/.fetched"
	echo ">> $family fetched in $((SECONDS - start))s ($(du -sh "$root" | cut -f1))"
}

want=("$@")
pids=()
failed=0
for f in "${families[@]}"; do
	read -r family archive suite <<<"$f"
	if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " == *" $family "* ]]; then
		continue
	fi
	(fetch "$family" "$archive" "$suite" || { echo "cannot fetch the packages of $family" >&2; exit 1; }) &
	pids+=($!)
	if [ ${#pids[@]} -ge 3 ]; then
		wait "${pids[0]}" || failed=1
		pids=("${pids[@]:1}")
	fi
done
for pid in "${pids[@]}"; do
	wait "$pid" || failed=1
done
exit $failed
