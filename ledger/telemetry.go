package ledger

import (
	"context"
	"time"

	"github.com/toolfence/toolfence/residual"
)

// Description names a backend for telemetry (the database conventions of OpenTelemetry).
type Description struct {
	// System is the db.system.name: "postgresql", "badger".
	System string
	// Namespace is the db.namespace: the database and schema, or the directory. Empty when
	// unknown.
	Namespace string
	// Collection is the db.collection.name of the residuals ("toolfence_residuals"), if any.
	Collection string
	// Remote says the backend is reached over the network (spans of its steps are client
	// spans).
	Remote bool
}

// Describer is implemented by backends that describe themselves for telemetry.
type Describer interface {
	// Describe returns the backend's description; it does no I/O.
	Describe() Description
}

// OpenCount is the number of open residuals (pending, unknown, accepted) in one effective
// state, across every namespace, and when the current attempt of the oldest started.
type OpenCount struct {
	State residual.State
	Count int64
	// Oldest is the start of the oldest one's current attempt (zero when Count is 0).
	Oldest time.Time
}

// OpenCounter is implemented by backends that count open residuals cheaply: from an index or
// an in-memory count, never a scan of every residual. Metrics gauges read it on each scrape.
type OpenCounter interface {
	// OpenResiduals returns one OpenCount for each of pending, unknown and accepted, in that
	// order, by effective state at the ledger's clock (an expired pending counts as
	// unknown). It returns the backend's error when it cannot read.
	OpenResiduals(ctx context.Context) ([]OpenCount, error)
}

// ReplicaCounter is implemented by backends whose server may replicate to standbys (the
// PostgreSQL ledger). Metrics gauges read it on each scrape.
type ReplicaCounter interface {
	// AsyncReplicas returns how many standbys stream from the server when none of them is
	// synchronous (a failover to one can lose acknowledged writes), and 0 when there are
	// none or one is synchronous. It returns the backend's error when it cannot read.
	AsyncReplicas(ctx context.Context) (int, error)
}
