//go:build !unix

package badger

// checkPrivateDir does not check ownership where the platform has no unix owner and mode
// bits (Windows: the directory's ACL decides).
func checkPrivateDir(string) error { return nil }
