package httpguard_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/toolfence/toolfence/httpguard"
	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger/badger"
)

// Guard a mutating endpoint: a retry with the same Idempotency-Key replays the recorded
// response instead of charging again.
func ExampleGuard_Wrap() {
	dir, err := os.MkdirTemp("", "httpguard-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := badger.Open(dir, badger.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	ic, err := interceptor.New(store, interceptor.Options{Holder: "api-1"})
	if err != nil {
		log.Fatal(err)
	}
	guard, err := httpguard.New(ic, httpguard.Options{
		// Keys are scoped by the caller; take it from your authentication.
		Principal: func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	charges := 0
	h := guard.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":"ch_%d"}`, charges)
	}))

	for range 2 {
		r := httptest.NewRequest("POST", "/charges", strings.NewReader(`{"amount":1200}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-Tenant", "acme")
		r.Header.Set("Idempotency-Key", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Body.String(), "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201 {"charge":"ch_1"} replayed: false
	// 201 {"charge":"ch_1"} replayed: true
	// charges: 1
}
