package interceptor_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
)

// replicated is a ledger whose server streams to asynchronous standbys.
type replicated struct {
	ledger.Ledger
	async int
}

func (r *replicated) OpenResiduals(ctx context.Context) ([]ledger.OpenCount, error) {
	return r.Ledger.(ledger.OpenCounter).OpenResiduals(ctx)
}

func (r *replicated) AsyncReplicas(context.Context) (int, error) { return r.async, nil }

// gauge returns the value of the int64 gauge name, and whether it was reported.
func gauge(t *testing.T, reader *sdkmetric.ManualReader, name string) (int64, bool) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == name && len(g.DataPoints) == 1 {
				return g.DataPoints[0].Value, true
			}
		}
	}
	return 0, false
}

// TestObserveLedgerReportsAsyncReplicas: toolfence.ledger.async_replicas is reported, on
// each collection, for a ledger that counts its asynchronous standbys, and not at all for
// one that has none to count (badger).
func TestObserveLedgerReportsAsyncReplicas(t *testing.T) {
	b, err := badger.Open(t.TempDir(), badger.Options{})
	require.NoError(t, err)
	defer b.Close()

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	l := &replicated{Ledger: b, async: 2}
	_, err = interceptor.ObserveLedger(mp, l)
	require.NoError(t, err)
	n, ok := gauge(t, reader, "toolfence.ledger.async_replicas")
	require.True(t, ok)
	require.EqualValues(t, 2, n)
	l.async = 0
	n, _ = gauge(t, reader, "toolfence.ledger.async_replicas")
	require.Zero(t, n, "read again on each collection")

	plain := sdkmetric.NewManualReader()
	_, err = interceptor.ObserveLedger(sdkmetric.NewMeterProvider(sdkmetric.WithReader(plain)), b)
	require.NoError(t, err)
	_, ok = gauge(t, plain, "toolfence.ledger.async_replicas")
	require.False(t, ok)
}
