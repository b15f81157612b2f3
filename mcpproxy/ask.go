package mcpproxy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/mcpproxy/transport"
	"github.com/toolfence/toolfence/residual"
)

// The proxy asks the host's user (never the model) two things, when the host declared the
// elicitation capability, and otherwise decides as it would without asking:
//   - whether to run an identical call again (repeat.go: soon after its answer, nothing in
//     between): "Run it again" sends it as a new intent, anything else answers from the
//     ledger;
//   - whether an earlier call whose outcome is unknown took effect, once upstream (probe,
//     tasks/get) could not say: "Yes" or "No" is recorded as the key's resolution, with the
//     user's answer as its evidence and the host's user as who resolved it, and the call is
//     then replayed or sent; "I don't know" (or no answer) leaves the key unknown.
//
// A 2025-11-25 host (a session) is asked with an elicitation/create request of the proxy's
// own, waited for at most AskTimeout. A stateless 2026-07-28 host cannot be sent requests:
// the call is answered with an input_required round of the proxy's own (one elicitation
// input request, and a requestState the proxy made); the host continues the call with the
// user's answer, which the proxy takes and strips before anything goes upstream. The model
// cannot answer for the user: the question reaches the host's own elicitation handler, and
// an answer counts only for the question (its random requestState) and the outcome (the
// residual's token) it was asked about.

// AskTimeout bounds how long the proxy waits for a session host's user to answer.
const AskTimeout = 5 * time.Minute

// question is a question for the host's user about the outcome of key (the residual's
// token when asked): the answer holds for that outcome only.
type question struct {
	kind    string // askRepeat or askSettle
	key     string
	token   uint64
	message string
	choices []string
}

// The kinds of questions and their choices.
const (
	askRepeat = "repeat"
	askSettle = "settle"

	choiceRun      = "Run it again"
	choiceSkip     = "Don't run it"
	choiceYes      = "Yes, it took effect"
	choiceNo       = "No, it had no effect"
	choiceDontKnow = "I don't know"
)

// questionInput is the name of the proxy's input request in its own input_required round;
// ownStatePrefix begins the requestState the proxy makes for it.
const (
	questionInput  = "toolfence.dev/question"
	ownStatePrefix = "toolfence-question:"
)

// repeatQuestion asks whether to run tool's identical call again.
func repeatQuestion(tool string, res *interceptor.Result, why string) question {
	return question{kind: askRepeat, key: res.Key, token: res.Token, choices: []string{choiceRun, choiceSkip},
		message: fmt.Sprintf("The tool %q was called with the same arguments before (recorded %s UTC) and succeeded; %s. "+
			"toolfence cannot tell from the call alone whether this is a new request or a repeat of the same one. Run it again?",
			tool, res.RecordedAt.UTC().Format("2006-01-02 15:04:05"), why)}
}

// settleQuestion asks whether the earlier attempt v names took effect: what it was (the
// tool, with these arguments or others), when, and what upstream answered if anything.
func settleQuestion(tool string, args json.RawMessage, v *interceptor.Violation, ended, learned string) question {
	var b strings.Builder
	with := "with other arguments than this call's"
	if v.RequestMatches {
		with = "with the arguments " + truncate(string(args), 300)
	}
	fmt.Fprintf(&b, "An earlier call of the tool %q %s (attempt %d, begun %s UTC) may or may not have taken effect: toolfence never learned how it ended",
		tool, with, v.Attempt, v.Since.UTC().Format("2006-01-02 15:04:05"))
	if text := cmpStr(resultText(v.Result), ended); text != "" {
		fmt.Fprintf(&b, "; what toolfence saw of it: %q", truncate(text, 300))
	} else if v.Cause != nil {
		fmt.Fprintf(&b, " (%s)", truncate(v.Cause.Error(), 300))
	} else {
		b.WriteString("; nothing of how it ended was recorded")
	}
	if learned != "" {
		fmt.Fprintf(&b, "; asked, upstream said: %s", truncate(learned, 300))
	}
	b.WriteString(". Until that is settled the call is not sent again. Did the earlier call take effect?")
	return question{kind: askSettle, key: v.Key, token: v.Token, message: b.String(), choices: []string{choiceYes, choiceNo, choiceDontKnow}}
}

// howItEnded is what was recorded of how the attempt v names ended (its error text: what
// upstream answered, a timeout, a crash), "" when nothing was.
func (s *session) howItEnded(ctx context.Context, v *interceptor.Violation) string {
	r, err := s.p.ic.Ledger().Get(ctx, ledger.GetParams{Namespace: s.p.ic.Namespace(), Key: v.Key})
	if err != nil {
		return ""
	}
	for _, a := range r.Attempts {
		if a.Token == v.Token {
			return strings.TrimPrefix(a.Error, isErrorPrefix)
		}
	}
	return ""
}

// resultText is the text of a recorded tool result (its text blocks), or the result itself
// when it is not one; "" for none.
func resultText(result []byte) string {
	if len(result) == 0 {
		return ""
	}
	var r struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	}
	if json.Unmarshal(result, &r) != nil || r.Content == nil {
		return string(result)
	}
	var texts []string
	for _, c := range r.Content {
		if c.Type == "text" {
			texts = append(texts, c.Text)
		}
	}
	return strings.Join(texts, "\n")
}

// elicitParams are the params of an elicitation (form) asking q.
func (q question) elicitParams() map[string]any {
	return map[string]any{
		"message": q.message,
		"requestedSchema": map[string]any{
			"type":       "object",
			"properties": map[string]any{"answer": map[string]any{"type": "string", "title": "Your answer", "enum": q.choices}},
			"required":   []string{"answer"},
		},
	}
}

// answerOf reads the chosen choice of q from an elicitation result ("" for a decline, a
// cancel, or an answer that is not one of q's choices).
func (q question) answerOf(result json.RawMessage) string {
	var r struct {
		Action  string `json:"action"`
		Content struct {
			Answer string `json:"answer"`
		} `json:"content"`
	}
	if json.Unmarshal(result, &r) != nil || r.Action != "accept" {
		return ""
	}
	for _, c := range q.choices {
		if r.Content.Answer == c {
			return c
		}
	}
	return ""
}

// canAsk reports whether the host declared elicitation in form mode (an empty elicitation
// capability means form).
func (s *session) canAsk() bool {
	s.mu.Lock()
	caps := s.hostCaps
	s.mu.Unlock()
	var c struct {
		Elicitation *struct {
			Form json.RawMessage `json:"form"`
			URL  json.RawMessage `json:"url"`
		} `json:"elicitation"`
	}
	if json.Unmarshal(caps, &c) != nil || c.Elicitation == nil {
		return false
	}
	return c.Elicitation.Form != nil || c.Elicitation.URL == nil
}

// askSession asks a session host's user q with an elicitation/create request and returns
// the chosen choice, "" when there is none (declined, cancelled, no answer within
// AskTimeout, the host cancelled the call: ctx ended).
func (s *session) askSession(ctx context.Context, q question) string {
	ctx, cancel := context.WithTimeout(ctx, AskTimeout)
	defer cancel()
	params, _ := json.Marshal(q.elicitParams())
	resp, err := s.requestHost(ctx, "elicitation/create", params)
	if err != nil || resp.Error != nil {
		s.p.log.Info("toolfence proxy: the host's user gave no answer", "key", q.key, "question", q.kind, "err", cmpErr(err, resp))
		return ""
	}
	return q.answerOf(resp.Result)
}

func cmpErr(err error, resp *jsonrpc.Response) any {
	if err != nil {
		return err
	}
	if resp != nil && resp.Error != nil {
		return resp.Error
	}
	return nil
}

// askRound is the answer to a stateless host's call that asks q: an input_required round of
// the proxy's own (questions remembers it for the host's continuation).
func (s *session) askRound(q question) json.RawMessage {
	state := s.p.questions.add(q, s.p.clock().Now(), s.p.cfg.RoundTimeout)
	out, _ := json.Marshal(map[string]any{
		"resultType":    resultInputRequired,
		"inputRequests": map[string]any{questionInput: map[string]any{"method": "elicitation/create", "params": q.elicitParams()}},
		"requestState":  state,
	})
	return out
}

// ask asks the host's user q: for a session host at once (the choice, nil); for a stateless
// host by ending this call with a round of the proxy's own ("", the host's answer). It is
// called only when canAsk.
func (s *session) ask(ctx context.Context, req *jsonrpc.Request, q question) (string, *jsonrpc.Response) {
	if transport.Stateless(s.hostRevision()) {
		return "", &jsonrpc.Response{ID: req.ID, Result: s.askRound(q)}
	}
	return s.askSession(ctx, q), nil
}

// questions are the questions the proxy asked stateless hosts, by their requestState,
// until answered or expired (at most maxQuestions).
type questions struct {
	mu sync.Mutex
	m  map[string]askedQuestion
}

type askedQuestion struct {
	q       question
	expires time.Time
}

const maxQuestions = 4096

// add remembers q until ttl from now and returns its requestState.
func (qs *questions) add(q question, now time.Time, ttl time.Duration) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	state := ownStatePrefix + hex.EncodeToString(b[:])
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if qs.m == nil {
		qs.m = map[string]askedQuestion{}
	}
	if len(qs.m) >= maxQuestions {
		for k, a := range qs.m {
			if now.After(a.expires) {
				delete(qs.m, k)
			}
		}
		if len(qs.m) >= maxQuestions {
			for k := range qs.m { // full of live questions: forget any one
				delete(qs.m, k)
				break
			}
		}
	}
	qs.m[state] = askedQuestion{q: q, expires: now.Add(ttl)}
	return state
}

// take returns the question a continuation with requestState state answers, when it is one
// the proxy asked about key and has not expired, and forgets it; ok false otherwise.
func (qs *questions) take(state, key string, now time.Time) (question, bool) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	a, ok := qs.m[state]
	if !ok || a.q.key != key || now.After(a.expires) {
		return question{}, false
	}
	delete(qs.m, state)
	return a.q, true
}

// ownState reports whether a requestState is one the proxy made for a question.
func ownState(state string) bool { return strings.HasPrefix(state, ownStatePrefix) }

// answered is the host user's answer to the proxy's question a call continues.
type answered struct {
	q      question
	choice string // "" for none
}

// takeAnswer reads the answer a stateless host's continuation carries for the proxy's own
// question about key (nil when the call continues none, or one that expired or is not
// about key: the call is then judged afresh and may be asked again).
func (s *session) takeAnswer(params callParams, key string) *answered {
	if !ownState(params.RequestState) {
		return nil
	}
	q, ok := s.p.questions.take(params.RequestState, key, s.p.clock().Now())
	if !ok {
		return nil
	}
	var in map[string]json.RawMessage
	_ = json.Unmarshal(params.InputResponses, &in)
	return &answered{q: q, choice: q.answerOf(in[questionInput])}
}

// about returns the answer's choice when it answers a question of kind about the outcome
// token ("" for none: declined, cancelled or unreadable), and whether it does: a question
// answered, even with no choice, is not asked again.
func (a *answered) about(kind string, token uint64) (choice string, ok bool) {
	if a == nil || a.q.kind != kind || a.q.token != token {
		return "", false
	}
	return a.choice, true
}

// withoutOwnRound returns tools/call params without the requestState and inputResponses of
// the proxy's own question (upstream never sees them); params unchanged otherwise.
func withoutOwnRound(params json.RawMessage, p callParams) json.RawMessage {
	if !ownState(p.RequestState) {
		return params
	}
	var doc map[string]json.RawMessage
	if json.Unmarshal(params, &doc) != nil {
		return params
	}
	delete(doc, "requestState")
	delete(doc, "inputResponses")
	out, err := json.Marshal(doc)
	if err != nil {
		return params
	}
	return out
}

// resolveByUser records the user's answer (choiceYes or choiceNo) to the settle question q
// as the resolution of the earlier attempt v names, attributed to the host's user. It
// reports whether it was recorded (the caller begins again either way: a resolution that
// raced with another is seen there).
func (s *session) resolveByUser(bctx context.Context, v *interceptor.Violation, q question, choice string) bool {
	as := residual.Failed
	if choice == choiceYes {
		as = residual.Succeeded
	}
	who := "the user of " + cmpStr(s.hostName(), "the MCP host") + " (asked by toolfence proxy through elicitation)"
	_, err := s.p.ic.Resolve(bctx, interceptor.ResolveParams{
		Key: v.Key, As: as, IfToken: v.Token,
		By:       "host-user:" + cmpStr(s.hostName(), "unnamed-host"),
		Evidence: fmt.Sprintf("%s answered %q to: %s", who, choice, q.message),
		Note:     "settled by the host's user, not the model: " + choice,
	})
	if err != nil {
		s.p.log.Warn("toolfence proxy: could not record the host user's answer", "key", v.Key, "err", err)
		return false
	}
	s.p.log.Info("toolfence proxy: unknown outcome settled by the host's user", "key", v.Key, "as", as.String())
	return true
}
