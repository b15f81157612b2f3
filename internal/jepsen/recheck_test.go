package jepsen

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

func TestRecheck(t *testing.T) {
	d := os.Getenv("RECHECK")
	ops, err := ReadHistory(d + "/history.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for _, op := range ops {
		if op.In.Kind != KGC {
			keys[op.In.Key] = true
		}
	}
	pops := expandGC(porcupineOps(ops), keys)
	by := map[string][]porcupine.Operation{}
	for _, p := range pops {
		by[p.Input.(stepIn).op.In.Key] = append(by[p.Input.(stepIn).op.In.Key], p)
	}
	for _, k := range strings.Fields(os.Getenv("KEYS")) {
		_, info := porcupine.CheckOperationsVerbose(Model(), by[k], time.Minute)
		w := failingWindow(by[k], info)
		n := 0
		for i, l := range w {
			if strings.HasPrefix(l, "✗") {
				n = i
			}
		}
		t.Log(k + "\n" + strings.Join(w[max(0, n-25):], "\n"))
	}
}
