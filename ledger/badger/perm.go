package badger

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
)

// ErrUnsafeDir is wrapped by Open's error when the store's directory is owned by another
// user or writable by group or others: whoever can write it can delete the ledger, and a
// retry would then repeat effects that already happened.
var ErrUnsafeDir = errors.New("badger: the store's directory is not private to this user")

// unsafeDirError says what is wrong with a store directory and what to do about it.
type unsafeDirError struct {
	dir  string
	msg  string
	hint string
}

func (e *unsafeDirError) Error() string {
	return fmt.Sprintf("badger: store directory %s %s: other users could delete or replace the ledger "+
		"(a retry would then repeat effects that already happened); %s", e.dir, e.msg, e.hint)
}

func (e *unsafeDirError) Is(target error) bool { return target == ErrUnsafeDir }

// userName returns "uid N (name)", or "uid N" when the name is unknown.
func userName(uid uint32) string {
	s := "uid " + strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil && u.Username != "" {
		s += " (" + u.Username + ")"
	}
	return s
}

// prepareDir makes dir ready to hold a store: a missing dir is created with mode 0700 (and
// missing parents with 0700 too); an existing one must pass checkPrivateDir. A directory
// another user creates first (a squatter in /tmp) is refused, not adopted.
func prepareDir(dir string) error {
	err := os.Mkdir(dir, 0o700)
	if errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
			return fmt.Errorf("badger: creating store directory %s: %w", dir, err)
		}
		err = os.Mkdir(dir, 0o700) // only a dir this call created counts as new
	}
	switch {
	case err == nil:
		// Ours and new: 0700 whatever the umask took (it only ever removes bits).
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("badger: store directory %s: %w", dir, err)
		}
	case !errors.Is(err, os.ErrExist):
		return fmt.Errorf("badger: creating store directory %s: %w", dir, err)
	}
	return checkPrivateDir(dir)
}
