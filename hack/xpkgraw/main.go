// Command xpkgraw rewrites the package.yaml layer of a package that
// `crossplane xpkg build` made, with the package's YAML files as written
// rather than as the CLI re-encoded them. The CLI (v2.2.1) decodes each
// object into its own Go types and encodes them again, which drops every
// field those types lack: the XRD's subresources among them, so that an
// installed fleet has no /scale and neither kubectl scale nor an HPA can
// size it. The CLI's build still lints the package and adds its examples
// layer; this keeps both, and checks that the raw stream parses into the
// same objects the CLI's did.
//
// Usage: go run ./hack/xpkgraw -package _output/x.xpkg -root <package root>
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/xpkg"
	"github.com/crossplane/crossplane-runtime/v2/pkg/xpkg/parser"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
)

func main() {
	pkg := flag.String("package", "", "the .xpkg file to rewrite in place")
	root := flag.String("root", "", "the package root it was built from (crossplane.yaml and the objects' YAML files)")
	flag.Parse()
	if *pkg == "" || *root == "" {
		fmt.Fprintln(os.Stderr, "usage: xpkgraw -package FILE.xpkg -root DIR")
		os.Exit(2)
	}
	if err := rewrite(*pkg, *root); err != nil {
		fmt.Fprintln(os.Stderr, "xpkgraw:", err)
		os.Exit(1)
	}
}

// Stream is the package root's YAML as one stream: crossplane.yaml first,
// then every other .yaml file below root, in path order, each as written.
func Stream(root string) ([]byte, error) {
	meta, err := os.ReadFile(filepath.Join(root, "crossplane.yaml"))
	if err != nil {
		return nil, errors.Wrap(err, "cannot read the package metadata")
	}
	var files []string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".yaml") && p != filepath.Join(root, "crossplane.yaml") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, errors.Wrap(err, "cannot list the package root")
	}
	sort.Strings(files)
	var b bytes.Buffer
	for i, f := range append([]string{""}, files...) {
		raw := meta
		if i > 0 {
			if raw, err = os.ReadFile(f); err != nil {
				return nil, errors.Wrapf(err, "cannot read %s", f)
			}
		}
		b.WriteString("---\n")
		b.Write(raw)
		if len(raw) > 0 && raw[len(raw)-1] != '\n' {
			b.WriteByte('\n')
		}
	}
	return b.Bytes(), nil
}

// objects lists the kind/name of each object a stream parses into, and the
// package's meta kind.
func objects(stream []byte) (string, []string, error) {
	metaScheme, err := xpkg.BuildMetaScheme()
	if err != nil {
		return "", nil, err
	}
	objScheme, err := xpkg.BuildObjectScheme()
	if err != nil {
		return "", nil, err
	}
	p, err := parser.New(metaScheme, objScheme).Parse(context.Background(), io.NopCloser(bytes.NewReader(stream)))
	if err != nil {
		return "", nil, errors.Wrap(err, "cannot parse the package stream")
	}
	if len(p.GetMeta()) != 1 {
		return "", nil, errors.Errorf("the package stream has %d metadata objects, not 1", len(p.GetMeta()))
	}
	var out []string
	for _, o := range p.GetObjects() {
		out = append(out, names(o))
	}
	sort.Strings(out)
	return names(p.GetMeta()[0]), out, nil
}

func names(o runtime.Object) string {
	m, err := meta.Accessor(o)
	if err != nil {
		return fmt.Sprintf("%T", o)
	}
	return o.GetObjectKind().GroupVersionKind().Kind + "/" + m.GetName()
}

// streamOf reads the package.yaml of a layer.
func streamOf(l v1.Layer) ([]byte, error) {
	rc, err := l.Uncompressed()
	if err != nil {
		return nil, err
	}
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err != nil {
			return nil, errors.Wrap(err, "no package.yaml in the layer")
		}
		if filepath.Base(h.Name) == xpkg.StreamFile {
			return io.ReadAll(tr)
		}
	}
}

func rewrite(pkgFile, root string) error {
	img, err := tarball.ImageFromPath(pkgFile, nil)
	if err != nil {
		return errors.Wrapf(err, "cannot read %s", pkgFile)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	raw, err := Stream(root)
	if err != nil {
		return err
	}
	newCfg := cfg.Config.DeepCopy()
	newCfg.Labels = map[string]string{}
	out := empty.Image
	replaced := false
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		label := cfg.Config.Labels[xpkg.Label(d.String())]
		if label != xpkg.PackageAnnotation {
			if label != "" {
				newCfg.Labels[xpkg.Label(d.String())] = label
			}
			if out, err = mutate.AppendLayers(out, l); err != nil {
				return err
			}
			continue
		}
		built, err := streamOf(l)
		if err != nil {
			return err
		}
		wantMeta, want, err := objects(built)
		if err != nil {
			return errors.Wrap(err, "the built package")
		}
		gotMeta, got, err := objects(raw)
		if err != nil {
			return errors.Wrap(err, "the raw package")
		}
		if gotMeta != wantMeta || strings.Join(got, ",") != strings.Join(want, ",") {
			return errors.Errorf("the raw stream holds %s %v, the built one %s %v", gotMeta, got, wantMeta, want)
		}
		nl, err := xpkg.Layer(bytes.NewReader(raw), xpkg.StreamFile, xpkg.PackageAnnotation, int64(len(raw)), xpkg.StreamFileMode, newCfg)
		if err != nil {
			return errors.Wrap(err, "cannot build the package layer")
		}
		if out, err = mutate.AppendLayers(out, nl); err != nil {
			return err
		}
		replaced = true
	}
	if !replaced {
		return errors.Errorf("%s has no layer labelled %s", pkgFile, xpkg.PackageAnnotation)
	}
	if out, err = mutate.Config(out, *newCfg); err != nil {
		return err
	}
	tmp := pkgFile + ".tmp"
	if err := tarball.WriteToFile(tmp, nil, out); err != nil {
		return errors.Wrapf(err, "cannot write %s", tmp)
	}
	return errors.Wrap(os.Rename(tmp, pkgFile), "cannot replace the package")
}
