package jepsen

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"time"
)

// pgCluster is a throwaway PostgreSQL server the harness starts itself (initdb and pg_ctl in
// a temporary directory, on a free port), so that it can restart it; the machine's shared
// server is never touched. As root, the server runs as the postgres user (runuser).
type pgCluster struct {
	dir, data, logFile string
	port               int
	asPostgres         bool
	initdb, pgCtl      string
}

// startCluster creates and starts the cluster. It returns an error naming what failed
// (missing binaries, initdb, start) with the server log's tail.
func startCluster(ctx context.Context) (*pgCluster, error) {
	c := &pgCluster{asPostgres: os.Geteuid() == 0}
	var err error
	if c.initdb, err = exec.LookPath("initdb"); err != nil {
		return nil, fmt.Errorf("jepsen: the PostgreSQL runs need initdb and pg_ctl on PATH: %w", err)
	}
	if c.pgCtl, err = exec.LookPath("pg_ctl"); err != nil {
		return nil, fmt.Errorf("jepsen: the PostgreSQL runs need initdb and pg_ctl on PATH: %w", err)
	}
	if c.dir, err = os.MkdirTemp("", "toolfence-jepsen-pg-"); err != nil {
		return nil, err
	}
	c.data, c.logFile = filepath.Join(c.dir, "data"), filepath.Join(c.dir, "server.log")
	if c.asPostgres {
		u, err := user.Lookup("postgres")
		if err != nil {
			c.remove()
			return nil, fmt.Errorf("jepsen: running as root, the throwaway cluster needs a postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(c.dir, uid, gid); err != nil {
			c.remove()
			return nil, err
		}
	}
	if c.port, err = freePort(); err != nil {
		c.remove()
		return nil, err
	}
	if out, err := c.run(ctx, c.initdb, "-D", c.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"); err != nil {
		c.remove()
		return nil, fmt.Errorf("jepsen: initdb: %w: %s", err, out)
	}
	if err := c.ctl(ctx, "start"); err != nil {
		c.remove()
		return nil, err
	}
	return c, nil
}

func (c *pgCluster) run(ctx context.Context, bin string, args ...string) ([]byte, error) {
	var cmd *exec.Cmd
	if c.asPostgres {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", bin}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, bin, args...)
	}
	cmd.Dir = c.dir
	return cmd.CombinedOutput()
}

// ctl runs pg_ctl start, stop or restart (stops are immediate: a crash, then recovery).
func (c *pgCluster) ctl(ctx context.Context, action string) error {
	args := []string{action, "-D", c.data, "-w", "-t", "60"}
	switch action {
	case "start", "restart":
		args = append(args, "-l", c.logFile, "-o",
			fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=on", c.port, c.dir))
	}
	if action != "start" {
		args = append(args, "-m", "immediate")
	}
	if out, err := c.run(ctx, c.pgCtl, args...); err != nil {
		tail, _ := os.ReadFile(c.logFile)
		if len(tail) > 2000 {
			tail = tail[len(tail)-2000:]
		}
		return fmt.Errorf("jepsen: pg_ctl %s: %w: %s\nserver log: %s", action, err, out, tail)
	}
	return nil
}

// dsn is the cluster's address, or addr instead of it (the fault proxy).
func (c *pgCluster) dsn(addr string) string {
	if addr == "" {
		addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port))
	}
	return "postgres://postgres@" + addr + "/postgres?sslmode=disable"
}

// addr is the server's host:port.
func (c *pgCluster) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)) }

// stop stops the server and removes its directory.
func (c *pgCluster) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_ = c.ctl(ctx, "stop")
	c.remove()
}

func (c *pgCluster) remove() { _ = os.RemoveAll(c.dir) }

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
