package postgres

import "github.com/toolfence/toolfence/ledger"

// ListQuery exposes the statement List runs for p, for plan checks.
func ListQuery(p ledger.ListParams) (string, []any) {
	return listQuery(p, 100, 0)
}

// BarrierSQL is the statement a retried write waits on before it answers.
const BarrierSQL = barrierSQL

// OpenSQL is the statement OpenResiduals runs ($1: offset µs).
var OpenSQL = openSQL
