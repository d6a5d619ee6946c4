package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"connectrpc.com/connect"
)

// maxUserFile caps how much of /etc/passwd or /etc/group is read. The guest's
// root filesystem belongs to the user, so these files are hostile input.
const maxUserFile = 4 << 20

// identity is who a process runs as, or who owns a written file.
type identity struct {
	uid, gid uint32
	groups   []uint32 // supplementary groups, primary gid first
	name     string   // user name, or the uid in decimal
	home     string
}

// userDB resolves user specs against passwd and group files, without os/user
// (no cgo, no NSS: the guest's files are all there is).
type userDB struct {
	passwd, group string
}

type passwdEntry struct {
	name     string
	uid, gid uint32
	home     string
}

type groupEntry struct {
	name    string
	gid     uint32
	members []string
}

// resolve turns a spec ("", "name", "uid", "name:group", "uid:gid", or any
// mix) into an identity. An empty spec is root. A numeric uid that passwd
// does not know runs with gid = uid, no supplementary groups and HOME=/.
func (db userDB) resolve(spec string) (identity, error) {
	if strings.IndexByte(spec, 0) >= 0 || len(spec) > 256 {
		return identity{}, invalidf("invalid user")
	}
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if hasGroup && groupPart == "" {
		return identity{}, invalidf("invalid user: empty group")
	}
	if userPart == "" {
		if hasGroup {
			return identity{}, invalidf("invalid user: empty user")
		}
		userPart = "0"
	}
	users, err := readPasswd(db.passwd)
	if err != nil {
		return identity{}, err
	}

	var id identity
	var pw *passwdEntry
	if uid, ok := parseID(userPart); ok {
		id.uid, id.gid, id.name, id.home = uid, uid, userPart, "/"
		if uid == 0 {
			id.name, id.home = "root", "/root"
		}
		for i := range users {
			if users[i].uid == uid {
				pw = &users[i]
				break
			}
		}
	} else {
		for i := range users {
			if users[i].name == userPart {
				pw = &users[i]
				break
			}
		}
		if pw == nil {
			return identity{}, connect.NewError(connect.CodeNotFound, errors.New("unknown user"))
		}
	}
	if pw != nil {
		id.uid, id.gid, id.name, id.home = pw.uid, pw.gid, pw.name, pw.home
		if id.home == "" {
			id.home = "/"
		}
	}

	groups, err := readGroup(db.group)
	if err != nil {
		return identity{}, err
	}
	if hasGroup {
		if gid, ok := parseID(groupPart); ok {
			id.gid = gid
		} else {
			i := slices.IndexFunc(groups, func(g groupEntry) bool { return g.name == groupPart })
			if i < 0 {
				return identity{}, connect.NewError(connect.CodeNotFound, errors.New("unknown group"))
			}
			id.gid = groups[i].gid
		}
	}
	id.groups = []uint32{id.gid}
	if pw != nil {
		for _, g := range groups {
			if slices.Contains(g.members, pw.name) && !slices.Contains(id.groups, g.gid) {
				id.groups = append(id.groups, g.gid)
			}
		}
	}
	return id, nil
}

// parseID parses a uid or gid: decimal, below 2^32-1 ((uid_t)-1 means "no
// change" to the kernel).
func parseID(s string) (uint32, bool) {
	if s == "" || s[0] < '0' || s[0] > '9' {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 1<<32-1 {
		return 0, false
	}
	return uint32(n), true
}

func readPasswd(path string) ([]passwdEntry, error) {
	var out []passwdEntry
	err := readColonFile(path, func(f []string) {
		if len(f) < 7 {
			return
		}
		uid, ok1 := parseID(f[2])
		gid, ok2 := parseID(f[3])
		if f[0] == "" || !ok1 || !ok2 {
			return
		}
		out = append(out, passwdEntry{name: f[0], uid: uid, gid: gid, home: f[5]})
	})
	return out, err
}

func readGroup(path string) ([]groupEntry, error) {
	var out []groupEntry
	err := readColonFile(path, func(f []string) {
		if len(f) < 4 {
			return
		}
		gid, ok := parseID(f[2])
		if f[0] == "" || !ok {
			return
		}
		var members []string
		for m := range strings.SplitSeq(f[3], ",") {
			if m = strings.TrimSpace(m); m != "" {
				members = append(members, m)
			}
		}
		out = append(out, groupEntry{name: f[0], gid: gid, members: members})
	})
	return out, err
}

// readColonFile calls fn with the fields of each line of a passwd-style file.
// A missing file has no lines. The file must be regular (a FIFO planted by
// the user must not hang the agent) and is read up to maxUserFile bytes.
func readColonFile(path string, fn func([]string)) error {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return sysError("open user database", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return sysError("stat user database", err)
	}
	if !fi.Mode().IsRegular() {
		return preconditionf("user database is not a regular file")
	}
	b, err := io.ReadAll(io.LimitReader(f, maxUserFile))
	if err != nil {
		return sysError("read user database", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), maxUserFile)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		fn(strings.Split(line, ":"))
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("parse user database: %w", err)
	}
	return nil
}
