package transport

import (
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// SetBackoff sets the least wait of an HTTP upstream connection before it resumes a stream
// after a failed attempt (DefaultRetry otherwise), so tests of its bounds run fast.
func SetBackoff(c mcp.Connection, d time.Duration) { c.(*httpConn).backoff = d }
