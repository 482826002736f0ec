// Command images builds the project's images as OCI image tarballs, without
// a container engine, with go-containerregistry:
//
//   - the runtime images of provider-egressproxy, function-proxyfleet and
//     egress-discovery: a static Go binary, the CA bundle, a non-root user
//     and an entrypoint. `make packages` embeds the provider's and the
//     function's tarballs in their Crossplane packages;
//   - for `make cluster`: the pause (sandbox) image, CoreDNS and Crossplane
//     core, each from a static binary built from its pinned module, and
//     the Squid image of the pod backend, from Debian's packages (see
//     squid.go).
//
// main.go holds the command, the table of static-binary images and how
// each is built and written; squid.go assembles the Squid image from
// Debian's packages and those holding the libraries their programs load.
//
// Usage: go run ./cluster/images -o _output/images [name ...]
package main

import (
	"archive/tar"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Registry is where the images are published; the tarballs carry this name.
const Registry = "gitea.home.hrajfrisbee.cz/kacerr"

// nonRoot is the user every image runs as, as in distroless' nonroot.
const nonRoot = 65532

// component is one image of a static binary.
type component struct {
	image string // repository name under Registry
	pkg   string // Go package of the binary
	// prebuilt, instead of pkg, is a binary under bin/ that make tools
	// built from a module of its own.
	prebuilt string
	binary   string // file name in /usr/local/bin
	// trees are folders under bin/ copied into the image, by destination.
	trees   map[string]string
	ports   []string
	comment string
	// tag, when set, is the image's tag instead of the project's version:
	// the version of the module it is built from.
	tag string
}

// Components by name; the name is also the binary's file name.
const (
	provider  = "provider"
	function  = "function"
	discovery = "discovery"
	// The images make cluster adds.
	pause      = "pause"
	coredns    = "coredns"
	crossplane = "crossplane"
	// Ports: metrics (and discovery's API), health probes, gRPC.
	port8080 = "8080/tcp"
	port8081 = "8081/tcp"
	port9443 = "9443/tcp"
)

var components = map[string]component{
	provider: {
		image: "provider-egressproxy-controller", pkg: "./cmd/provider", binary: provider,
		ports: []string{port8080, port8081}, comment: "provider-egressproxy controller",
	},
	function: {
		image: "function-proxyfleet-runtime", pkg: "./cmd/function", binary: function,
		ports: []string{port9443, port8080}, comment: "function-proxyfleet gRPC server",
	},
	discovery: {
		image: "egress-discovery", pkg: "./cmd/discovery", binary: discovery,
		ports: []string{port8080, port8081}, comment: "egress-discovery API and lease controller",
	},
	pause: {
		image: pause, pkg: "./cluster/pause", binary: pause, comment: "make cluster's pod sandbox",
	},
	coredns: {
		image: coredns, prebuilt: coredns, binary: coredns,
		ports: []string{"1053/udp", "1053/tcp"}, comment: "make cluster's DNS (CoreDNS, pinned in hack/tools/coredns)", tag: "v1.15.0",
	},
	crossplane: {
		image: crossplane, prebuilt: "crossplane-core", binary: crossplane,
		trees:   map[string]string{"crds": "crossplane-crds"},
		comment: "Crossplane core (pinned in hack/tools/core) with the CRDs core init installs", tag: "v2.4.0",
	},
}

// Squid is the name of the pod backend's Squid image (see squid.go).
const Squid = "squid"

// Names are every image this command builds, in build order.
var Names = []string{provider, function, discovery, pause, coredns, crossplane, Squid}

// epoch stamps every file and the image config, so a rebuild from the same
// source yields the same digests.
var epoch = time.Unix(0, 0).UTC()

func main() {
	out := flag.String("o", "_output/images", "Folder for the <name>.tar image tarballs.")
	version := flag.String("version", "v0.1.0", "Tag of the images.")
	caBundle := flag.String("ca-bundle", "/etc/ssl/certs/ca-certificates.crt", "CA bundle copied into each image (Debian: apt-get install ca-certificates).")
	bin := flag.String("bin", "bin", "Folder of the prebuilt binaries (make tools).")
	debs := flag.String("deb-cache", ".cache/debs", "Folder where the Squid image's Debian packages are downloaded.")
	flag.Parse()
	names := flag.Args()
	if len(names) == 0 {
		names = []string{"provider", "function", "discovery"}
	}
	if err := run(*out, *version, *caBundle, *bin, *debs, names); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run(out, version, caBundle, binDir, debs string, names []string) error {
	ca, err := os.ReadFile(caBundle)
	if err != nil {
		return errors.Wrap(err, "cannot read the CA bundle")
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return errors.Wrap(err, "cannot create the output folder")
	}
	for _, n := range names {
		start := time.Now()
		path := filepath.Join(out, n+".tar")
		var img v1.Image
		repo, tag := "", version
		if n == Squid {
			repo = SquidImage
			img, err = squidImage(debs)
		} else {
			c, ok := components[n]
			if !ok {
				return errors.Errorf("unknown image %q: want one of %v", n, Names)
			}
			repo = c.image
			if c.tag != "" {
				tag = c.tag
			}
			img, err = binaryImage(c, binDir, ca)
		}
		if err != nil {
			return errors.Wrapf(err, "cannot build the %s image", n)
		}
		if err := write(img, repo, tag, path); err != nil {
			return errors.Wrapf(err, "cannot write the %s image", n)
		}
		fmt.Printf("built %s (%s) in %.1fs\n", path, repo, time.Since(start).Seconds())
	}
	return nil
}

// binaryImage compiles or reads a component's binary and assembles its
// image.
func binaryImage(c component, binDir string, ca []byte) (v1.Image, error) {
	var bin []byte
	var err error
	if c.prebuilt != "" {
		bin, err = os.ReadFile(filepath.Join(binDir, c.prebuilt))
		if err != nil {
			return nil, errors.Wrapf(err, "cannot read bin/%s: run make tools", c.prebuilt)
		}
	} else if bin, err = compile(c.pkg); err != nil {
		return nil, err
	}
	var extra []file
	for dst, src := range c.trees {
		fs, err := tree(filepath.Join(binDir, src), dst)
		if err != nil {
			return nil, errors.Wrapf(err, "cannot read bin/%s: run make tools", src)
		}
		extra = append(extra, fs...)
	}
	return Image(c, bin, ca, extra...)
}

// tree reads a folder's regular files as image files under dst.
func tree(src, dst string) ([]file, error) {
	out := []file{{name: dst + "/", mode: 0o755, dir: true}}
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == src {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			out = append(out, file{name: dst + "/" + filepath.ToSlash(rel) + "/", mode: 0o755, dir: true})
			return nil
		}
		b, err := os.ReadFile(p)
		out = append(out, file{name: dst + "/" + filepath.ToSlash(rel), mode: 0o644, body: b})
		return err
	})
	return out, err
}

func write(img v1.Image, repo, version, path string) error {
	ref, err := name.NewTag(fmt.Sprintf("%s/%s:%s", Registry, repo, version))
	if err != nil {
		return errors.Wrap(err, "cannot name the image")
	}
	tmp := path + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		return errors.Wrap(err, "cannot write the image tarball")
	}
	return errors.Wrap(os.Rename(tmp, path), "cannot move the image tarball into place")
}

// compile builds a static binary for the host's architecture: the images
// hold no libc, so cgo must be off.
func compile(pkg string) ([]byte, error) {
	dir, err := os.MkdirTemp("", "images-")
	if err != nil {
		return nil, errors.Wrap(err, "cannot create a build folder")
	}
	defer os.RemoveAll(dir) //nolint:errcheck // A temp folder.
	bin := filepath.Join(dir, "bin")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, errors.Wrapf(err, "cannot build %s", pkg)
	}
	b, err := os.ReadFile(bin)
	return b, errors.Wrap(err, "cannot read the binary")
}

// Image assembles one image: a single layer with the binary, the CA bundle
// and the user database, and a config that runs the binary as nonroot.
func Image(c component, bin, ca []byte, extra ...file) (v1.Image, error) {
	layer, err := rootfs(c, bin, ca, extra)
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return nil, errors.Wrap(err, "cannot add the layer")
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, errors.Wrap(err, "cannot read the image config")
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = runtime.GOARCH, "linux"
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config.User = fmt.Sprintf("%d:%d", nonRoot, nonRoot)
	cfg.Config.Entrypoint = []string{"/usr/local/bin/" + c.binary}
	cfg.Config.WorkingDir = "/home/nonroot"
	cfg.Config.Env = []string{
		"PATH=/usr/local/bin:/usr/bin:/bin",
		"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
	}
	cfg.Config.ExposedPorts = map[string]struct{}{}
	for _, p := range c.ports {
		cfg.Config.ExposedPorts[p] = struct{}{}
	}
	cfg.Config.Labels = map[string]string{
		"org.opencontainers.image.source":      "https://gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator",
		"org.opencontainers.image.description": c.comment,
	}
	img, err = mutate.ConfigFile(img, cfg)
	return img, errors.Wrap(err, "cannot set the image config")
}

type file struct {
	name string
	mode int64
	uid  int
	body []byte
	dir  bool
	link string // a symbolic link to link
}

func rootfs(c component, bin, ca []byte, extra []file) (v1.Layer, error) {
	files := []file{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/passwd", mode: 0o644, body: []byte(fmt.Sprintf(
			"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", nonRoot, nonRoot))},
		{name: "etc/group", mode: 0o644, body: []byte(fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", nonRoot))},
		{name: "etc/ssl/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, body: ca},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/nonroot/", mode: 0o700, uid: nonRoot, dir: true},
		{name: "tmp/", mode: 0o1777, dir: true},
		{name: "usr/", mode: 0o755, dir: true},
		{name: "usr/local/", mode: 0o755, dir: true},
		{name: "usr/local/bin/", mode: 0o755, dir: true},
		{name: "usr/local/bin/" + c.binary, mode: 0o755, body: bin},
	}
	files = append(files, extra...)
	return tarLayer(files)
}

// tarLayer writes files, in order, as one uncompressed layer.
func tarLayer(files []file) (v1.Layer, error) {
	entries := make([]tarEntry, 0, len(files))
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.uid, ModTime: epoch, Typeflag: tar.TypeReg, Size: int64(len(f.body))}
		switch {
		case f.dir:
			h.Typeflag, h.Size = tar.TypeDir, 0
		case f.link != "":
			h.Typeflag, h.Size, h.Linkname = tar.TypeSymlink, 0, f.link
		}
		entries = append(entries, tarEntry{hdr: h, body: f.body})
	}
	return entriesLayer(entries)
}
