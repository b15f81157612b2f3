// Package lazyfs is a FUSE filesystem that loses, at a simulated power cut, everything that
// was not fsynced: the jepsen harness runs the badger ledger on it to check the sync path.
// It imports go-fuse and the standard library only; only evals/jepsen and tests import it.
//
// # What it models
//
// A strict disk: nothing survives a power cut unless an fsync made it durable.
//
//   - File contents and size: write and truncate change the file as every process sees it
//     (kept in memory, per 4 KiB page); fsync or fdatasync of the file, through any
//     descriptor, makes its whole current contents and size durable (written to its blob
//     in the backing directory). The two calls are the same here: the size, the only
//     metadata the FS keeps per file besides its mode, counts as needed to read the data.
//   - Directory entries: create, mkdir, unlink, rmdir and rename change a directory as every
//     process sees it; fsync of the directory makes its current entries durable, and only
//     that does. A new file whose directory was not synced disappears at a cut even when its
//     own data was synced; an unlinked file comes back; a rename reverts. A rename between
//     two directories is durable in each of them separately: synced in one only, a cut
//     leaves the file in both or in neither. Synced entries of a new directory survive only
//     when the directory's own entry in its parent was synced as well.
//   - Cut unmounts (the kernel's page cache of the mount goes with it: nothing the kernel
//     held survives either), resets every file and directory to its durable state, deletes
//     the blobs of files that no durable entry reaches, and mounts again.
//
// # What it does not model
//
//   - Real disks often keep more than this: ext4 in ordered mode commits a new entry's
//     directory with the journal, many drives write in order. A history that passes here
//     passes on those; a loss found here may not reproduce on a given real disk, but it is
//     allowed by POSIX.
//   - Torn writes and reordering inside unsynced data: unsynced data is either all gone (a
//     cut) or all there; a cut never keeps some unsynced pages of a file and drops others.
//   - Modes are durable at once; modification times are reported but not kept across a
//     cut; owner and time changes are accepted and ignored. Renaming a directory and
//     RENAME_EXCHANGE fail with ENOTSUP; hard links, symlinks, special files and extended
//     attributes are refused (operations the FS does not implement). File locks are the
//     kernel's local ones.
//   - The durable state lives in this process (the namespace in memory, the contents in the
//     backing directory as one blob a file, named by inode number): the FS is the disk, and
//     it lasts as long as the process serving it. It is not an image to reopen elsewhere;
//     Export copies the durable tree out (as hard links) for that.
//
// A process must not read a mount it serves through mmap: a page fault blocks a thread the
// Go scheduler does not know is waiting, and enough of them stop the server. Serve from
// the test or harness process and run the program under test as a child.
package lazyfs
