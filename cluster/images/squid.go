package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// SquidImage is the repository of the pod backend's Squid image under
// Registry; internal/backend/kubernetes.DefaultImage names it.
const SquidImage = "egress-squid"

// squidRoots are the Debian packages the image is made of, before the
// libraries their programs load: Squid and its helpers, its data (icons,
// error pages), and the shell and tools the pod's start command and the
// credentials helper run (sh, grep, tr, date).
var squidRoots = []string{"squid", "squid-common", "squid-langpack", "dash", "grep", "coreutils", "netbase", "libc6"}

// squidUID is the proxy user of Debian's base-passwd, which the pod backend
// runs Squid as.
const squidUID = 13

// skipped are the parts of a package no container reads.
var skipped = []string{"usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/lintian/", "usr/share/locale/"}

// squidImage assembles the Squid image from Debian's packages: the roots
// and every package owning a shared library an ELF file of the image needs,
// found by reading the files' DT_NEEDED entries until nothing is missing.
// Each package is one layer, unpacked as dpkg-deb would; maintainer scripts
// are not run, so the image's user database is written by hand. The
// packages are downloaded with apt-get into cache; which package holds a
// library is asked of this machine's dpkg database, so the libraries
// Squid needs must be installed here (they are, with Squid, which the
// tests run).
func squidImage(cache string) (v1.Image, error) {
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, errors.Wrap(err, "cannot create the package cache")
	}
	c := &closure{cache: cache, have: map[string][]tarEntry{}, versions: map[string]string{}, provided: map[string]bool{}, files: map[string]bool{}}
	for queue := append([]string(nil), squidRoots...); len(queue) > 0; {
		for _, pkg := range queue {
			if err := c.add(pkg); err != nil {
				return nil, err
			}
		}
		queue = nil
		for _, lib := range c.missing() {
			pkg, err := owner(lib)
			if err != nil {
				return nil, err
			}
			if _, ok := c.have[pkg]; ok {
				return nil, errors.Errorf("package %s holds %s outside the library folders", pkg, lib)
			}
			queue = append(queue, pkg)
		}
	}
	return c.image()
}

// closure is a set of Debian packages, unpacked, and what they hold.
type closure struct {
	cache    string
	have     map[string][]tarEntry // package -> its files
	versions map[string]string
	provided map[string]bool // sonames held in library folders
	files    map[string]bool // every path held
	loads    []load          // what the ELF files load
}

// load is what one ELF file needs: its loader and its libraries.
type load struct {
	dir, interp string
	libs        []string
}

// add downloads and unpacks a package, unless the closure has it.
func (c *closure) add(pkg string) error {
	if _, ok := c.have[pkg]; ok {
		return nil
	}
	deb, ver, err := download(c.cache, pkg)
	if err != nil {
		return err
	}
	entries, err := unpack(deb)
	if err != nil {
		return errors.Wrapf(err, "cannot unpack %s", deb)
	}
	c.versions[pkg], c.have[pkg] = ver, entries
	for _, e := range entries {
		c.files[strings.TrimSuffix(e.hdr.Name, "/")] = true
		if isLibDir(path.Dir(e.hdr.Name)) {
			c.provided[path.Base(e.hdr.Name)] = true
		}
		if interp, libs := interpreter(e), needed(e); interp != "" || len(libs) > 0 {
			c.loads = append(c.loads, load{dir: path.Dir(e.hdr.Name), interp: interp, libs: libs})
		}
	}
	return nil
}

// missing lists, sorted, the sonames the closure's programs and libraries
// load that none of its packages holds, and their loader when it lacks it.
func (c *closure) missing() []string {
	missing := map[string]bool{}
	for _, l := range c.loads {
		// The loader must be in the image, by the path programs name, as a
		// file or a link.
		if l.interp != "" && !c.files[l.interp] {
			missing[path.Base(l.interp)] = true
		}
		for _, lib := range l.libs {
			// A plugin's own folder (gconv's, through $ORIGIN) counts.
			if !c.provided[lib] && !c.files[path.Join(l.dir, lib)] {
				missing[lib] = true
			}
		}
	}
	libs := make([]string, 0, len(missing))
	for lib := range missing {
		libs = append(libs, lib)
	}
	sort.Strings(libs)
	return libs
}

// image assembles the closure, one layer per package in name order, with
// the user database on top.
func (c *closure) image() (v1.Image, error) {
	have, versions := c.have, c.versions
	pkgs := make([]string, 0, len(have))
	for p := range have {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	var labels []string
	for _, p := range pkgs {
		layer, err := entriesLayer(have[p])
		if err != nil {
			return nil, errors.Wrapf(err, "cannot make the layer of %s", p)
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			return nil, errors.Wrap(err, "cannot add a layer")
		}
		labels = append(labels, p+"="+versions[p])
	}
	users, err := tarLayer([]file{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/passwd", mode: 0o644, body: []byte(fmt.Sprintf("root:x:0:0:root:/root:/usr/sbin/nologin\nproxy:x:%d:%d:proxy:/bin:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", squidUID, squidUID))},
		{name: "etc/group", mode: 0o644, body: []byte(fmt.Sprintf("root:x:0:\nproxy:x:%d:\nnogroup:x:65534:\n", squidUID))},
		{name: "tmp/", mode: 0o1777, dir: true},
	})
	if err != nil {
		return nil, err
	}
	if img, err = mutate.AppendLayers(img, users); err != nil {
		return nil, errors.Wrap(err, "cannot add the user layer")
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, errors.Wrap(err, "cannot read the image config")
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = runtime.GOARCH, "linux"
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config.User = fmt.Sprintf("%d:%d", squidUID, squidUID)
	cfg.Config.Cmd = []string{"squid", "-N", "-f", "/etc/squid/squid.conf"}
	cfg.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cfg.Config.ExposedPorts = map[string]struct{}{"3128/tcp": {}}
	cfg.Config.Labels = map[string]string{
		"org.opencontainers.image.source":      "https://gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator",
		"org.opencontainers.image.description": "Squid from Debian's packages, for the pod backend of provider-egressproxy",
		"io.egress-proxies.debian-packages":    strings.Join(labels, " "),
	}
	img, err = mutate.ConfigFile(img, cfg)
	return img, errors.Wrap(err, "cannot set the image config")
}

// tarEntry is one file of a package.
type tarEntry struct {
	hdr  *tar.Header
	body []byte
}

// download fetches pkg's candidate version, the one apt-get install would
// take, into cache, unless a .deb of it is there already; it returns the
// file and the version.
func download(cache, pkg string) (string, string, error) {
	// apt-get names the file <name>_<version, ':' as %3a>_<arch>.deb.
	name, _, _ := strings.Cut(pkg, ":")
	glob := filepath.Join(cache, name+"_*.deb")
	m, _ := filepath.Glob(glob)
	// A cached file of another version than apt's candidate is stale (a
	// security update came since): fetch the candidate.
	if want := candidate(pkg); want != "" && len(m) == 1 && !strings.HasPrefix(filepath.Base(m[0]), name+"_"+strings.ReplaceAll(want, ":", "%3a")+"_") {
		_ = os.Remove(m[0])
		m = nil
	}
	if len(m) == 0 {
		cmd := exec.Command("apt-get", "download", "-q", pkg)
		cmd.Dir = cache
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", "", errors.Errorf("apt-get download %s: %v: %s", pkg, err, strings.TrimSpace(string(out)))
		}
		m, _ = filepath.Glob(glob)
	}
	if len(m) != 1 {
		return "", "", errors.Errorf("want one %s, found %d: empty %s to download afresh", glob, len(m), cache)
	}
	ver, err := exec.Command("dpkg-deb", "-f", m[0], "Version").Output()
	return m[0], strings.TrimSpace(string(ver)), errors.Wrapf(err, "cannot read the version of %s", m[0])
}

// candidate is the version apt-get would install, or "" when apt does not
// know.
func candidate(pkg string) string {
	out, err := exec.Command("apt-cache", "policy", pkg).Output()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Candidate: "); ok && v != "(none)" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// owner names the installed package holding the shared library soname in
// a library folder.
func owner(soname string) (string, error) {
	out, err := exec.Command("dpkg-query", "-S", "*/"+soname).CombinedOutput()
	if err != nil {
		return "", errors.Errorf("no installed package holds %s, which the Squid image needs: %s", soname, strings.TrimSpace(string(out)))
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkgs, file, ok := strings.Cut(line, ": ")
		if !ok || path.Base(file) != soname || !isLibDir(strings.TrimPrefix(path.Dir(file), "/")) {
			continue
		}
		// "libfoo:amd64, libfoo-dev:amd64" when several hold the path;
		// a multiarch machine may list a foreign architecture's first.
		var first string
		for _, p := range strings.Split(pkgs, ",") {
			p = strings.TrimSpace(p)
			if first == "" {
				first = p
			}
			if _, arch, ok := strings.Cut(p, ":"); !ok || arch == nativeArch() {
				return p, nil
			}
		}
		return first, nil
	}
	return "", errors.Errorf("no installed package holds %s in a library folder", soname)
}

// isLibDir reports whether the dynamic loader searches dir (relative to the
// root) by default.
func isLibDir(dir string) bool {
	switch strings.TrimPrefix(dir, "./") {
	case "lib", "usr/lib", "lib64", "usr/lib64", "lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu",
		"lib/aarch64-linux-gnu", "usr/lib/aarch64-linux-gnu":
		return true
	}
	return false
}

// needed lists the sonames an ELF file loads; nothing for other files.
func needed(e tarEntry) []string {
	if e.hdr.Typeflag != tar.TypeReg || len(e.body) < 4 || !bytes.Equal(e.body[:4], []byte(elf.ELFMAG)) {
		return nil
	}
	f, err := elf.NewFile(bytes.NewReader(e.body))
	if err != nil {
		return nil
	}
	libs, _ := f.ImportedLibraries()
	return libs
}

// interpreter is the dynamic loader an ELF program names (PT_INTERP),
// relative to the root; "" for other files.
func interpreter(e tarEntry) string {
	if e.hdr.Typeflag != tar.TypeReg || len(e.body) < 4 || !bytes.Equal(e.body[:4], []byte(elf.ELFMAG)) {
		return ""
	}
	f, err := elf.NewFile(bytes.NewReader(e.body))
	if err != nil {
		return ""
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				return ""
			}
			return strings.TrimPrefix(strings.TrimRight(string(b), "\x00"), "/")
		}
	}
	return ""
}

func nativeArch() string {
	out, err := exec.Command("dpkg", "--print-architecture").Output()
	if err != nil {
		return runtime.GOARCH
	}
	return strings.TrimSpace(string(out))
}

// unpack reads a .deb's file tree, as dpkg-deb --fsys-tarfile gives it,
// without the parts no container reads and with names relative to the root.
func unpack(deb string) ([]tarEntry, error) {
	out, err := exec.Command("dpkg-deb", "--fsys-tarfile", deb).Output()
	if err != nil {
		return nil, errors.Wrap(err, "dpkg-deb --fsys-tarfile")
	}
	tr := tar.NewReader(bytes.NewReader(out))
	var entries []tarEntry
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return entries, nil
		}
		if err != nil {
			return nil, err
		}
		h.Name = strings.TrimPrefix(h.Name, "./")
		if h.Name == "" || skip(h.Name) {
			continue
		}
		if clean := path.Clean(h.Name); path.IsAbs(h.Name) || clean == ".." || strings.HasPrefix(clean, "../") {
			return nil, errors.Errorf("%s holds %q, outside the root", deb, h.Name)
		}
		// No setuid or setgid bits: Squid runs unprivileged.
		h.Mode &^= 0o6000
		body, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		h.ModTime, h.AccessTime, h.ChangeTime = epoch, epoch, epoch
		h.Uname, h.Gname = "", ""
		h.Format = tar.FormatPAX
		entries = append(entries, tarEntry{hdr: h, body: body})
	}
}

func skip(name string) bool {
	for _, p := range skipped {
		if strings.HasPrefix(name, p) && name != p {
			return true
		}
	}
	return false
}

// entriesLayer writes entries, in order, as one uncompressed layer.
func entriesLayer(entries []tarEntry) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		if err := tw.WriteHeader(e.hdr); err != nil {
			return nil, errors.Wrapf(err, "cannot write %s", e.hdr.Name)
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, errors.Wrapf(err, "cannot write %s", e.hdr.Name)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, errors.Wrap(err, "cannot close the layer")
	}
	b := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer))
	return layer, errors.Wrap(err, "cannot make the layer")
}
