package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// watchBuffer is how many changes a watch holds for a slow reader before it drops some.
const watchBuffer = 256

// watchReconnect bounds the wait between reconnection attempts of a watch.
var watchReconnect = [...]time.Duration{50 * time.Millisecond, 200 * time.Millisecond, time.Second, 5 * time.Second}

// Watch implements ledger.Watcher with LISTEN/NOTIFY on a dedicated connection. Every
// residual write but a lease renewal notifies in its own transaction while at least one
// watch is registered (NOTIFY serialises committing writers, so nobody pays for it while
// nobody listens). The
// channel closes when ctx ends or the ledger is closed; a lost connection is re-established
// with backoff, and changes made while it was down are missed (re-list after a gap). A slow
// reader misses changes instead of blocking writers. It fails when the first connection or
// LISTEN fails (with ctx's error when ctx ended meanwhile).
func (l *Ledger) Watch(ctx context.Context, namespace string) (<-chan ledger.Change, error) {
	if err := l.check(); err != nil {
		return nil, err
	}
	conn, err := l.listen(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("postgres: watch: %w", context.Cause(ctx))
		}
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(l.ctx, cancel)
	ch := make(chan ledger.Change, watchBuffer)
	l.watches.Add(1)
	go func() {
		defer l.watches.Done()
		defer close(ch)
		defer stop()
		defer cancel()
		l.watchLoop(ctx, conn, namespace, ch)
	}()
	return ch, nil
}

// channel is the notification channel of the ledger's schema (see notifySQL).
func (l *Ledger) channel() string {
	c := "toolfence:" + l.schema
	if len(c) > 63 {
		c = c[:63]
	}
	return c
}

// listen opens a dedicated connection, LISTENs on the schema's channel and registers it as
// a watcher, so writers start notifying.
func (l *Ledger) listen(ctx context.Context) (*pgx.Conn, error) {
	conn, err := connect(ctx, l.conn)
	if err != nil {
		return nil, err
	}
	_, err = conn.Exec(ctx, `LISTEN `+pgx.Identifier{l.channel()}.Sanitize())
	if err == nil {
		_, err = conn.Exec(ctx, `DELETE FROM toolfence_watchers WHERE pid NOT IN (SELECT pid FROM pg_stat_activity)`)
	}
	if err == nil {
		_, err = conn.Exec(ctx, `INSERT INTO toolfence_watchers (pid) VALUES ($1) ON CONFLICT DO NOTHING`, conn.PgConn().PID())
	}
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, unavailable(l.conn, err)
	}
	return conn, nil
}

// unlisten closes a watch connection and unregisters it (through the pool: the
// connection itself may be broken), so writers stop notifying once nobody listens.
func (l *Ledger) unlisten(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	pid := conn.PgConn().PID()
	_ = conn.Close(ctx)
	_, _ = l.pool.Exec(ctx, `DELETE FROM toolfence_watchers WHERE pid = $1`, pid)
}

type notification struct {
	Namespace string `json:"n"`
	Key       string `json:"k"`
	State     string `json:"s"`
}

func (l *Ledger) watchLoop(ctx context.Context, conn *pgx.Conn, namespace string, ch chan<- ledger.Change) {
	defer func() {
		if conn != nil {
			l.unlisten(conn)
		}
	}()
	fails := 0
	for {
		if conn == nil {
			wait := watchReconnect[min(fails, len(watchReconnect)-1)]
			select {
			case <-ctx.Done():
				return
			case <-l.clock.After(wait):
			}
			c, err := l.listen(ctx)
			if err != nil {
				fails++
				continue
			}
			conn, fails = c, 0
		}
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// The connection broke: drop it and reconnect.
			l.unlisten(conn)
			conn = nil
			continue
		}
		var msg notification
		if json.Unmarshal([]byte(n.Payload), &msg) != nil || namespace != "" && msg.Namespace != namespace {
			continue
		}
		select {
		case ch <- ledger.Change{Namespace: msg.Namespace, Key: msg.Key, State: residual.State(msg.State)}:
		default: // a slow reader misses changes; it re-lists after a gap
		}
	}
}
