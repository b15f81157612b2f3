// Package pgcluster starts throwaway PostgreSQL servers for tests and fault runs: initdb and
// pg_ctl in a temporary directory, on a free port of 127.0.0.1, so that a test may crash,
// reconfigure, replicate and promote them; the machine's shared server is never touched.
// It imports nothing of ours; only tests and internal/jepsen use it.
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Cluster is one throwaway server. As root, it runs as the postgres user (runuser). Its
// methods are not safe for concurrent use.
type Cluster struct {
	// Dir holds the data directory, the server log and the socket; Stop removes it.
	Dir     string
	data    string
	logFile string
	// Port is the server's TCP port on 127.0.0.1.
	Port       int
	asPostgres bool
	bin        string // directory of initdb, pg_ctl and pg_basebackup
	settings   []string
}

// Options shape a cluster. The zero value starts a primary with fsync on.
type Options struct {
	// Settings are extra `name=value` server settings, passed as -c on every start (so
	// they win over postgresql.conf and ALTER SYSTEM).
	Settings []string
}

// Start creates and starts a cluster. It returns an error naming what failed (missing
// binaries, initdb, start) with the server log's tail.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	c, err := newCluster(o)
	if err != nil {
		return nil, err
	}
	if out, err := c.run(ctx, c.tool("initdb"), "-D", c.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"); err != nil {
		c.remove()
		return nil, fmt.Errorf("pgcluster: initdb: %w: %s", err, out)
	}
	// Replication connections from 127.0.0.1 (trust), for Standby.
	if err := c.appendConf("pg_hba.conf", "host replication all 127.0.0.1/32 trust\n"); err != nil {
		c.remove()
		return nil, err
	}
	if err := c.Ctl(ctx, "start"); err != nil {
		c.remove()
		return nil, err
	}
	return c, nil
}

// Standby creates a streaming standby of c with pg_basebackup -R, connecting to primary
// (host:port; c's own address when empty, or a fault proxy in front of it), with the
// application_name name, and starts it. Its settings are c's plus o.Settings.
func (c *Cluster) Standby(ctx context.Context, primary, name string, o Options) (*Cluster, error) {
	s, err := newCluster(Options{Settings: append(append([]string(nil), c.settings...), o.Settings...)})
	if err != nil {
		return nil, err
	}
	if primary == "" {
		primary = c.Addr()
	}
	host, port, _ := net.SplitHostPort(primary)
	conninfo := fmt.Sprintf("host=%s port=%s user=postgres application_name=%s", host, port, name)
	if out, err := s.run(ctx, s.tool("pg_basebackup"), "-D", s.data, "-d", conninfo, "-R", "-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		s.remove()
		return nil, fmt.Errorf("pgcluster: pg_basebackup: %w: %s", err, out)
	}
	if err := s.Ctl(ctx, "start"); err != nil {
		s.remove()
		return nil, err
	}
	return s, nil
}

func newCluster(o Options) (*Cluster, error) {
	c := &Cluster{asPostgres: os.Geteuid() == 0, settings: o.Settings}
	var err error
	if c.bin, err = binDir(); err != nil {
		return nil, err
	}
	if c.Dir, err = os.MkdirTemp("", "toolfence-pg-"); err != nil {
		return nil, err
	}
	c.data, c.logFile = filepath.Join(c.Dir, "data"), filepath.Join(c.Dir, "server.log")
	if c.asPostgres {
		u, err := user.Lookup("postgres")
		if err != nil {
			c.remove()
			return nil, fmt.Errorf("pgcluster: running as root, a throwaway cluster needs a postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(c.Dir, uid, gid); err != nil {
			c.remove()
			return nil, err
		}
	}
	if c.Port, err = freePort(); err != nil {
		c.remove()
		return nil, err
	}
	return c, nil
}

// binDir finds initdb and pg_ctl: on PATH, else in /usr/lib/postgresql/15/bin.
func binDir() (string, error) {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		d := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	const debian = "/usr/lib/postgresql/15/bin"
	if _, err := os.Stat(filepath.Join(debian, "pg_ctl")); err == nil {
		return debian, nil
	}
	return "", errors.New("pgcluster: a throwaway cluster needs initdb and pg_ctl (on PATH or in " + debian + ")")
}

func (c *Cluster) tool(name string) string { return filepath.Join(c.bin, name) }

func (c *Cluster) appendConf(file, text string) error {
	f, err := os.OpenFile(filepath.Join(c.data, file), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	return errors.Join(err, f.Close())
}

func (c *Cluster) run(ctx context.Context, bin string, args ...string) ([]byte, error) {
	var cmd *exec.Cmd
	if c.asPostgres {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", bin}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, bin, args...)
	}
	cmd.Dir = c.Dir
	return cmd.CombinedOutput()
}

// Ctl runs pg_ctl start, stop, restart or promote. Stops and restarts are immediate: a
// crash, then recovery on the next start.
func (c *Cluster) Ctl(ctx context.Context, action string) error {
	args := []string{action, "-D", c.data, "-w", "-t", "60"}
	switch action {
	case "start", "restart":
		opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=on", c.Port, c.Dir)
		for _, s := range c.settings {
			opts += " -c " + s
		}
		args = append(args, "-l", c.logFile, "-o", opts)
	}
	if action == "stop" || action == "restart" {
		args = append(args, "-m", "immediate")
	}
	if out, err := c.run(ctx, c.tool("pg_ctl"), args...); err != nil {
		return fmt.Errorf("pgcluster: pg_ctl %s: %w: %s\nserver log: %s", action, err, out, c.LogTail(2000))
	}
	return nil
}

// Restart crashes the server (immediate stop) and starts it again with settings added to
// its own (a later setting of the same name wins).
func (c *Cluster) Restart(ctx context.Context, settings ...string) error {
	c.settings = append(c.settings, settings...)
	return c.Ctl(ctx, "restart")
}

// LogTail returns the last n bytes of the server log.
func (c *Cluster) LogTail(n int) string {
	tail, _ := os.ReadFile(c.logFile)
	if len(tail) > n {
		tail = tail[len(tail)-n:]
	}
	return strings.TrimSpace(string(tail))
}

// DSN is the address of database db (postgres when empty) as user postgres, at addr
// (host:port) instead of the server's own when addr is set (a fault proxy).
func (c *Cluster) DSN(addr, db string) string {
	if addr == "" {
		addr = c.Addr()
	}
	if db == "" {
		db = "postgres"
	}
	return "postgres://postgres@" + addr + "/" + db + "?sslmode=disable"
}

// Addr is the server's host:port.
func (c *Cluster) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Port)) }

// Stop crashes the server (immediate stop) and removes its directory. It is safe to call
// after the server is down.
func (c *Cluster) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_ = c.Ctl(ctx, "stop")
	c.remove()
}

func (c *Cluster) remove() { _ = os.RemoveAll(c.Dir) }

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
