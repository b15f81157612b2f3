package ledger

import (
	"context"

	"github.com/toolfence/toolfence/residual"
)

// Change tells that a residual was written. It carries no payload beyond the state: readers
// call Get for the record.
type Change struct {
	Namespace string
	Key       string
	State     residual.State
}

// Watcher is implemented by ledgers that can stream changes. It is optional: check with a
// type assertion.
type Watcher interface {
	// Watch delivers changes of one namespace (every namespace when empty) until ctx ends,
	// then closes the channel. A slow reader may miss changes but never blocks writers; it
	// should re-list after a gap.
	Watch(ctx context.Context, namespace string) (<-chan Change, error)
}
