package main

import (
	"archive/zip"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
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
	leftOut, err := publish(m, "v0.2.0", out)
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
	leftOut, err := publish(m, "v0.2.0", out)
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
	if _, err := publish(m, "v0.2.0", t.TempDir()); err == nil || !strings.Contains(err.Error(), "LICENSE is not tracked") {
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
