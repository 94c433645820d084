// Command releaseproxy writes a file-based Go module proxy (GOPROXY=file://DIR)
// holding the given modules of this repository at one version, each zipped
// as the Go command would zip it when the version is published
// (golang.org/x/mod/zip: nested modules, vendor and VCS directories left
// out, every file checked). The files are those git tracks, as a tag
// publishes only what is committed, with their contents from the working
// tree, so that a change is checked before it is committed; a file git does
// not track (a new one not yet added, an ignored one) is left out, and
// named, so that an adopter's build fails here as it would once published.
// Outside a git work tree every file of the directory is zipped.
//
//	go run ./scripts/releaseproxy -version v0.1.0 -out /tmp/proxy . tenace/redislock
//
// Each module directory must hold a LICENSE file; releaseproxy fails
// otherwise. It also fails when a zip would carry a compiled program (an
// ELF, Mach-O, PE or WebAssembly file: a build output committed by
// mistake) or a file larger than MaxFileSize, and prints each zip's size. A module must have no replace line, and must require every
// other module it is given at -version: the modules are released together,
// and one that required another at an older version would, once published,
// build against that version, not the tree this checks. It is the first
// half of `make release-check`, which then builds and tests an adopter
// module outside the workspace against this proxy.
package main

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
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
	mods := make([]*mod, 0, flag.NArg())
	for _, dir := range flag.Args() {
		m, err := readMod(dir)
		if err != nil {
			fatalf("%s: %v", dir, err)
		}
		mods = append(mods, m)
	}
	if err := checkRequires(mods, *version); err != nil {
		fatalf("%v", err)
	}
	for _, m := range mods {
		leftOut, size, err := publish(m, *version, *out)
		if err != nil {
			fatalf("%s: %v", m.dir, err)
		}
		fmt.Printf("releaseproxy: %s@%s from %s: %s zip\n", m.path, *version, m.dir, humanSize(size))
		if len(leftOut) > 0 {
			const most = 10
			more := ""
			if len(leftOut) > most {
				more = fmt.Sprintf(" and %d more", len(leftOut)-most)
				leftOut = leftOut[:most]
			}
			fmt.Printf("releaseproxy: left out of %s, not tracked by git (git add what the module needs): %s%s\n", m.path, strings.Join(leftOut, ", "), more)
		}
	}
}

// mod is one module to publish: its directory, path and go.mod.
type mod struct {
	dir, path string
	gomod     []byte
	file      *modfile.File
}

// readMod reads and checks dir's go.mod.
func readMod(dir string) (*mod, error) {
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return nil, err
	}
	// Parse, not ParseLax: ParseLax drops replace lines, as the Go command
	// does in a dependency's go.mod, so the check below would never fire.
	f, err := modfile.Parse("go.mod", gomod, nil)
	if err != nil {
		return nil, err
	}
	if f.Module == nil {
		return nil, errors.New("go.mod has no module line")
	}
	path := f.Module.Mod.Path
	if len(f.Replace) > 0 {
		// Go ignores a dependency's replace lines: an adopter would build
		// against something else than this module's tests did.
		return nil, fmt.Errorf("go.mod of %s has replace lines; a published module must not (go.work ties the modules for development)", path)
	}
	if _, err := os.Stat(filepath.Join(dir, "LICENSE")); err != nil {
		return nil, fmt.Errorf("%s has no LICENSE file: copy the root LICENSE there, so that the module's zip carries it", path)
	}
	return &mod{dir: dir, path: path, gomod: gomod, file: f}, nil
}

// checkRequires fails when one of mods requires another at a version other
// than version. The proxy holds only version, and the adopter requires
// every module at version, so that minimal version selection would hide
// such a line here; published, the module would build against the older
// version of the other, without what this tree has added to it since.
func checkRequires(mods []*mod, version string) error {
	published := make(map[string]bool, len(mods))
	for _, m := range mods {
		published[m.path] = true
	}
	var wrong []string
	for _, m := range mods {
		for _, r := range m.file.Require {
			if published[r.Mod.Path] && r.Mod.Version != version {
				wrong = append(wrong, fmt.Sprintf("%s requires %s %s", m.path, r.Mod.Path, r.Mod.Version))
			}
		}
	}
	if len(wrong) > 0 {
		return fmt.Errorf("%s, not %s: the modules are released together; change the version in every go.mod, in go.work and in scripts/release-check", strings.Join(wrong, "; "), version)
	}
	return nil
}

// publish writes m at version into the proxy at out, and returns the files
// of m's directory it left out because git does not track them and the
// size of the zip in bytes. It writes nothing when the zip would carry a
// compiled program or a file larger than MaxFileSize.
func publish(m *mod, version, out string) (leftOut []string, size int, err error) {
	escaped, err := module.EscapePath(m.path)
	if err != nil {
		return nil, 0, err
	}
	vdir := filepath.Join(out, filepath.FromSlash(escaped), "@v")
	mv := module.Version{Path: m.path, Version: version}
	files, leftOut, err := trackedFiles(m.dir)
	if err != nil {
		return nil, 0, err
	}
	for _, p := range leftOut {
		if p == "go.mod" || p == "LICENSE" {
			return nil, 0, fmt.Errorf("%s is not tracked by git, so a tag would not publish it: git add it", p)
		}
	}
	var zipped bytes.Buffer
	if files == nil {
		err = modzip.CreateFromDir(&zipped, mv, m.dir)
	} else {
		err = modzip.Create(&zipped, mv, files)
	}
	if err != nil {
		return nil, 0, err
	}
	if err := checkZip(zipped.Bytes()); err != nil {
		return nil, 0, fmt.Errorf("%s@%s: %w", m.path, version, err)
	}
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return nil, 0, err
	}
	info, _ := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	proxyFiles := map[string][]byte{
		version + ".mod":  m.gomod,
		version + ".zip":  zipped.Bytes(),
		version + ".info": info,
	}
	for name, data := range proxyFiles {
		if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
			return nil, 0, err
		}
	}
	return leftOut, zipped.Len(), appendLine(filepath.Join(vdir, "list"), version)
}

// MaxFileSize is the largest file a module zip may carry: the modules are
// source, and a larger file is a build output, a data set or a capture
// committed by mistake, which every adopter would download.
const MaxFileSize = 1 << 20

// checkZip fails, naming every such file, when the module zip z carries a
// compiled program or a file larger than MaxFileSize.
func checkZip(z []byte) error {
	r, err := zip.NewReader(bytes.NewReader(z), int64(len(z)))
	if err != nil {
		return fmt.Errorf("reading the zip back: %w", err)
	}
	var bad []string
	for _, f := range r.File {
		name := f.Name // path@version/file: a module path has no @
		if i := strings.Index(name, "@"); i >= 0 {
			if j := strings.Index(name[i:], "/"); j >= 0 {
				name = name[i+j+1:]
			}
		}
		if f.UncompressedSize64 > MaxFileSize {
			bad = append(bad, fmt.Sprintf("%s is %s (more than %s)", name, humanSize(int(f.UncompressedSize64)), humanSize(MaxFileSize)))
			continue
		}
		rc, err := f.Open()
		if err != nil {
			return fmt.Errorf("reading %s back from the zip: %w", name, err)
		}
		head := make([]byte, 4096) // PE headers begin within the first few hundred bytes
		n, err := io.ReadFull(rc, head)
		rc.Close()
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			return fmt.Errorf("reading %s back from the zip: %w", name, err)
		}
		if kind := programKind(head[:n]); kind != "" {
			bad = append(bad, fmt.Sprintf("%s is a compiled program (%s)", name, kind))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("the zip would carry %s: a module publishes source only; git rm the file (and add build outputs to .gitignore)", strings.Join(bad, "; "))
	}
	return nil
}

// programKind names the executable format head (a file's first bytes)
// begins with, or returns "" when it is none of them.
func programKind(head []byte) string {
	switch {
	case bytes.HasPrefix(head, []byte("\x7fELF")):
		return "ELF"
	case bytes.HasPrefix(head, []byte("\x00asm")):
		return "WebAssembly"
	case len(head) >= 4:
		switch binary.BigEndian.Uint32(head) {
		case 0xfeedface, 0xfeedfacf, 0xcefaedfe, 0xcffaedfe:
			return "Mach-O"
		case 0xcafebabe, 0xbebafeca:
			return "Mach-O universal" // also a Java class file: compiled either way
		}
	}
	// PE: the DOS header's MZ, whose e_lfanew (at 0x3c) points at "PE\0\0".
	if len(head) >= 0x40 && bytes.HasPrefix(head, []byte("MZ")) {
		off := int(binary.LittleEndian.Uint32(head[0x3c:]))
		if off+4 <= len(head) && bytes.Equal(head[off:off+4], []byte("PE\x00\x00")) {
			return "PE"
		}
	}
	return ""
}

// humanSize writes n bytes as B, KiB or MiB.
func humanSize(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// trackedFiles returns the files of dir that git tracks and that exist in
// the working tree, for modzip.Create (which leaves out those of nested
// modules and vendor directories, as CreateFromDir does), and the files
// CreateFromDir would have zipped that git does not track (slash paths
// relative to dir). files is nil when dir is not in a git work tree.
func trackedFiles(dir string) (files []modzip.File, leftOut []string, err error) {
	if err := exec.Command("git", "-C", dir, "rev-parse", "--is-inside-work-tree").Run(); err != nil {
		return nil, nil, nil // not in a work tree, or no git: the directory as it is
	}
	out, err := exec.Command("git", "-C", dir, "ls-files", "-z", "--", ".").Output()
	if err != nil {
		return nil, nil, fmt.Errorf("git ls-files: %w", err)
	}
	tracked := make(map[string]bool)
	for _, p := range strings.Split(string(out), "\x00") {
		if p == "" {
			continue
		}
		info, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(p)))
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the working tree, not yet in git
		} else if err != nil {
			return nil, nil, err
		}
		tracked[p] = true
		files = append(files, dirFile{root: dir, slash: p, info: info})
	}
	if files == nil {
		files = []modzip.File{} // tracked, but nothing is: not nil
	}
	all, _ := modzip.CheckDir(dir) // its error is Create's to report
	for _, p := range all.Valid {
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return nil, nil, err
		}
		// .git: a worktree's link to its repository, a file here.
		if rel = filepath.ToSlash(rel); !tracked[rel] && rel != ".git" {
			leftOut = append(leftOut, rel)
		}
	}
	return files, leftOut, nil
}

// dirFile is a file of the working tree, as modzip.Create reads it.
type dirFile struct {
	root, slash string
	info        fs.FileInfo
}

func (f dirFile) Path() string                { return f.slash }
func (f dirFile) Lstat() (fs.FileInfo, error) { return f.info, nil }
func (f dirFile) Open() (io.ReadCloser, error) {
	return os.Open(filepath.Join(f.root, filepath.FromSlash(f.slash)))
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
