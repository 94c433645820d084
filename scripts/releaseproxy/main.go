// Command releaseproxy writes a file-based Go module proxy (GOPROXY=file://DIR)
// holding the given modules of this repository at one version, each zipped
// from the working tree exactly as the Go command would zip it when the
// version is published (golang.org/x/mod/zip: nested modules, vendor and VCS
// directories left out, every file checked).
//
//	go run ./scripts/releaseproxy -version v0.1.0 -out /tmp/proxy . tenace/redislock
//
// Each module directory must hold a LICENSE file, since a nested module's
// zip does not contain its parent's; releaseproxy fails otherwise. It is the
// first half of `make release-check`, which then builds and tests an adopter
// module outside the workspace against this proxy.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	modzip "golang.org/x/mod/zip"
)

func main() {
	version := flag.String("version", "v0.1.0", "the version every module is published at")
	out := flag.String("out", "", "the proxy directory to write (required)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: releaseproxy -version vX.Y.Z -out DIR MODULE_DIR...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *out == "" || flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if !semver.IsValid(*version) || semver.Canonical(*version) != *version {
		fatalf("-version %q is not a canonical semantic version such as v0.1.0", *version)
	}
	for _, dir := range flag.Args() {
		path, err := publish(dir, *version, *out)
		if err != nil {
			fatalf("%s: %v", dir, err)
		}
		fmt.Printf("releaseproxy: %s@%s from %s\n", path, *version, dir)
	}
}

// publish writes dir's module at version into the proxy at out and returns
// the module path.
func publish(dir, version, out string) (string, error) {
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return "", err
	}
	f, err := modfile.ParseLax("go.mod", gomod, nil)
	if err != nil {
		return "", err
	}
	if f.Module == nil {
		return "", errors.New("go.mod has no module line")
	}
	path := f.Module.Mod.Path
	if len(f.Replace) > 0 {
		// Go ignores a dependency's replace lines: an adopter would build
		// against something else than this module's tests did.
		return "", fmt.Errorf("go.mod of %s has replace lines; a published module must not (go.work ties the modules for development)", path)
	}
	if _, err := os.Stat(filepath.Join(dir, "LICENSE")); err != nil {
		return "", fmt.Errorf("%s has no LICENSE file: a nested module's zip does not contain its parent's, so copy the root LICENSE there", path)
	}
	escaped, err := module.EscapePath(path)
	if err != nil {
		return "", err
	}
	vdir := filepath.Join(out, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return "", err
	}
	mv := module.Version{Path: path, Version: version}
	var zipped bytes.Buffer
	if err := modzip.CreateFromDir(&zipped, mv, dir); err != nil {
		return "", err
	}
	info, _ := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	files := map[string][]byte{
		version + ".mod":  gomod,
		version + ".zip":  zipped.Bytes(),
		version + ".info": info,
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
			return "", err
		}
	}
	return path, appendLine(filepath.Join(vdir, "list"), version)
}

// appendLine adds version to the proxy's list of versions unless it is there.
func appendLine(list, version string) error {
	old, err := os.ReadFile(list)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, v := range strings.Fields(string(old)) {
		if v == version {
			return nil
		}
	}
	return os.WriteFile(list, append(old, version+"\n"...), 0o644)
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "releaseproxy: "+format+"\n", args...)
	os.Exit(1)
}
