package faultproxy

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// echoServer answers every line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, timeout time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	_, err := bufio.NewReader(c).ReadString('\n')
	return err
}

func TestFaults(t *testing.T) {
	p, err := Start("127.0.0.1:0", echoServer(t))
	require.NoError(t, err)
	defer p.Close()

	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	require.NoError(t, roundTrip(c, time.Second), "pass")

	p.SetLatency(100 * time.Millisecond)
	start := time.Now()
	require.NoError(t, roundTrip(c, time.Second))
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond, "latency applies per direction")
	p.SetLatency(0)

	p.SetMode(Blackhole)
	require.Error(t, roundTrip(c, 150*time.Millisecond), "blackhole: the reply never comes")
	p.SetMode(Pass)

	require.Equal(t, 1, p.Reset())
	require.Error(t, roundTrip(c, time.Second), "reset connection")

	c2, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	require.NoError(t, roundTrip(c2, time.Second))
	p.Partition()
	require.Error(t, roundTrip(c2, 150*time.Millisecond), "partition: silence")
	c3, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err, "a partition accepts and hangs new connections")
	require.Error(t, roundTrip(c3, 150*time.Millisecond))
	p.Heal()
	require.Error(t, roundTrip(c2, time.Second), "a connection cut by the partition is closed by the heal")
	c4, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	require.NoError(t, roundTrip(c4, time.Second), "healed")

	p.SetBandwidth(1000)
	start = time.Now()
	require.NoError(t, roundTrip(c4, time.Second))
	require.GreaterOrEqual(t, time.Since(start), 5*time.Millisecond)
}
