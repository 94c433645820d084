package main

import (
	"archive/zip"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"golang.org/x/mod/module"
)

// repo writes files (slash paths relative to a new directory) and, when
// commit is true, makes the directory a git repository with them committed.
func repo(t *testing.T, commit bool, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, data := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if commit {
		git(t, dir, "init", "-q")
		git(t, dir, "add", ".")
		git(t, dir, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "files")
	}
	return dir
}

func git(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// zipped returns the files of the zip publish wrote for path@version into
// the proxy at out, with their contents, without the zip's path@version/
// prefix.
func zipped(t *testing.T, out, path, version string) map[string]string {
	t.Helper()
	escaped, err := module.EscapePath(path)
	if err != nil {
		t.Fatal(err)
	}
	r, err := zip.OpenReader(filepath.Join(out, filepath.FromSlash(escaped), "@v", version+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	files := make(map[string]string)
	for _, f := range r.File {
		rc, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		files[strings.TrimPrefix(f.Name, path+"@"+version+"/")] = string(data)
	}
	return files
}

func keys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }

var rootFiles = map[string]string{
	"go.mod":      "module example.test/root\n\ngo 1.25\n",
	"LICENSE":     "license\n",
	"root.go":     "package root\n",
	"sub/LICENSE": "license\n",
	"sub/go.mod":  "module example.test/root/sub\n\ngo 1.25\n\nrequire example.test/root v0.2.0\n",
	"sub/sub.go":  "package sub\n",
}

// A tag publishes what git tracks: a file of the working tree that git does
// not track (a new one not yet added) is left out of the zip, and named, so
// that an adopter's build fails in release-check as it would once
// published; a tracked file's uncommitted change is zipped, so a change is
// checked before it is committed. Nested modules are left out, as always.
func TestPublishZipsWhatGitTracks(t *testing.T) {
	dir := repo(t, true, rootFiles)
	for p, data := range map[string]string{"root.go": "package root // changed\n", "new.go": "package root\n"} {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m, err := readMod(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	leftOut, _, err := publish(m, "v0.2.0", out)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(leftOut, []string{"new.go"}) {
		t.Errorf("left out %q, want [new.go]", leftOut)
	}
	files := zipped(t, out, "example.test/root", "v0.2.0")
	if got, want := keys(files), []string{"LICENSE", "go.mod", "root.go"}; !slices.Equal(got, want) {
		t.Errorf("zipped %q, want %q", got, want)
	}
	if files["root.go"] != "package root // changed\n" {
		t.Errorf("root.go zipped as %q, not as the working tree has it", files["root.go"])
	}
}

// Outside a git work tree (a source archive), the directory is zipped as it is.
func TestPublishOutsideGitZipsTheDirectory(t *testing.T) {
	dir := repo(t, false, rootFiles)
	m, err := readMod(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	leftOut, _, err := publish(m, "v0.2.0", out)
	if err != nil || leftOut != nil {
		t.Fatalf("publish: %q, %v", leftOut, err)
	}
	if got, want := keys(zipped(t, out, "example.test/root", "v0.2.0")), []string{"LICENSE", "go.mod", "root.go"}; !slices.Equal(got, want) {
		t.Errorf("zipped %q, want %q", got, want)
	}
}

// A LICENSE in the directory that git does not track would not be published.
func TestPublishRefusesAnUntrackedLicense(t *testing.T) {
	dir := repo(t, true, map[string]string{"go.mod": rootFiles["go.mod"], "root.go": rootFiles["root.go"]})
	if err := os.WriteFile(filepath.Join(dir, "LICENSE"), []byte("license\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := readMod(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := publish(m, "v0.2.0", t.TempDir()); err == nil || !strings.Contains(err.Error(), "LICENSE is not tracked") {
		t.Fatalf("publish: %v, want the untracked LICENSE named", err)
	}
}

// A module that requires another of the release at an older version would,
// once published, build against that one: refused, with what to change.
func TestCheckRequiresRefusesAnotherVersionOfTheRelease(t *testing.T) {
	dir := repo(t, false, rootFiles)
	var mods []*mod
	for _, d := range []string{dir, filepath.Join(dir, "sub")} {
		m, err := readMod(d)
		if err != nil {
			t.Fatal(err)
		}
		mods = append(mods, m)
	}
	if err := checkRequires(mods, "v0.2.0"); err != nil {
		t.Fatalf("the release's own version: %v", err)
	}
	err := checkRequires(mods, "v0.3.0")
	if err == nil || !strings.Contains(err.Error(), "example.test/root/sub requires example.test/root v0.2.0, not v0.3.0") {
		t.Fatalf("checkRequires at v0.3.0: %v", err)
	}
	// A module outside the release may be required at any version.
	if err := checkRequires(mods[1:], "v0.3.0"); err != nil {
		t.Fatalf("sub alone: %v", err)
	}
}

func TestReadModRefusesReplaceAndAMissingLicense(t *testing.T) {
	dir := repo(t, false, map[string]string{"go.mod": "module example.test/root\n\nreplace example.test/x => ../x\n", "LICENSE": "l\n"})
	if _, err := readMod(dir); err == nil || !strings.Contains(err.Error(), "replace") {
		t.Errorf("a replace line: %v", err)
	}
	dir = repo(t, false, map[string]string{"go.mod": rootFiles["go.mod"]})
	if _, err := readMod(dir); err == nil || !strings.Contains(err.Error(), "LICENSE") {
		t.Errorf("no LICENSE: %v", err)
	}
}

// programHead returns the first 64 KiB of this test's own binary: the
// header of a program compiled for this system (ELF, Mach-O or PE), in a
// file smaller than MaxFileSize, so that only its format can refuse it.
func programHead(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	head := make([]byte, 64<<10)
	if _, err := io.ReadFull(f, head); err != nil {
		t.Fatal(err)
	}
	return string(head)
}

// A compiled program or a file larger than MaxFileSize, committed in a
// module, is refused by name, and nothing is written to the proxy.
func TestPublishRefusesAProgramAndALargeFile(t *testing.T) {
	for name, extra := range map[string]map[string]string{
		"program":    {"tool": programHead(t)},
		"large file": {"testdata/capture.txt": strings.Repeat("x", MaxFileSize+1)},
		"both":       {"bin/tool": programHead(t), "big.json": strings.Repeat(" ", MaxFileSize+1)},
	} {
		t.Run(name, func(t *testing.T) {
			files := maps.Clone(rootFiles)
			maps.Copy(files, extra)
			m, err := readMod(repo(t, true, files))
			if err != nil {
				t.Fatal(err)
			}
			out := t.TempDir()
			_, _, err = publish(m, "v0.2.0", out)
			if err == nil {
				t.Fatal("publish zipped a module that carries a build output")
			}
			for p := range extra {
				if !strings.Contains(err.Error(), p+" is ") {
					t.Errorf("the error does not name %s: %v", p, err)
				}
			}
			if entries, _ := os.ReadDir(out); len(entries) > 0 {
				t.Errorf("publish wrote %d entries into the proxy before refusing", len(entries))
			}
		})
	}
}

// A module of source only is published, and its zip's size reported.
func TestPublishReportsTheZipSize(t *testing.T) {
	files := maps.Clone(rootFiles)
	files["data.txt"] = strings.Repeat("x", MaxFileSize) // at the limit: allowed
	m, err := readMod(repo(t, true, files))
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	_, size, err := publish(m, "v0.2.0", out)
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(filepath.Join(out, "example.test", "root", "@v", "v0.2.0.zip"))
	if err != nil {
		t.Fatal(err)
	}
	if int64(size) != info.Size() {
		t.Errorf("publish reported %d bytes, the zip has %d", size, info.Size())
	}
}

func TestProgramKind(t *testing.T) {
	pe := make([]byte, 0x100)
	copy(pe, "MZ")
	pe[0x3c] = 0x80
	copy(pe[0x80:], "PE\x00\x00")
	mzText := make([]byte, 0x100) // a text that happens to begin with MZ
	copy(mzText, "MZ is a two-letter code, "+strings.Repeat("and this is text. ", 12))
	cases := []struct {
		head, want string
	}{
		{"\x7fELF\x02\x01\x01", "ELF"},
		{"\xcf\xfa\xed\xfe\x07\x00", "Mach-O"},
		{"\xce\xfa\xed\xfe", "Mach-O"},
		{"\xfe\xed\xfa\xcf", "Mach-O"},
		{"\xca\xfe\xba\xbe\x00\x00\x00\x02", "Mach-O universal"},
		{"\x00asm\x01\x00\x00\x00", "WebAssembly"},
		{string(pe), "PE"},
		{string(mzText), ""},
		{"MZ", ""},
		{"package main\n", ""},
		{"#!/bin/sh\necho hi\n", ""},
		{"", ""},
	}
	if kind, ok := map[string]string{"linux": "ELF", "darwin": "Mach-O", "windows": "PE"}[runtime.GOOS]; ok {
		cases = append(cases, struct{ head, want string }{programHead(t), kind}) // this test's own binary
	}
	for _, c := range cases {
		if got := programKind([]byte(c.head)); got != c.want {
			t.Errorf("programKind(%q...) = %q, want %q", c.head[:min(len(c.head), 8)], got, c.want)
		}
	}
}

// scripts/release-check fails on a module that carries a compiled program,
// naming the file, before it builds anything against the proxy.
func TestReleaseCheckFailsOnAProgram(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	license, err := os.ReadFile(filepath.Join("..", "..", "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"go.mod":       rootFiles["go.mod"],
		"LICENSE":      string(license),
		"root.go":      rootFiles["root.go"],
		"releaseproxy": programHead(t), // a build output committed by mistake
	}
	dir := repo(t, true, files)
	cmd := exec.Command(filepath.Join("..", "release-check"))
	cmd.Env = append(os.Environ(), "MODULES="+dir)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("release-check passed a module carrying a compiled program:\n%s", out)
	}
	if !strings.Contains(string(out), "releaseproxy is a compiled program") {
		t.Fatalf("release-check failed (%v) without naming the program:\n%s", err, out)
	}
}
