package mcpproxy

import (
	"encoding/json"
	"regexp"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/residual"
)

// Servers toolfence knows. An isError answer proves no effect only in words that say the
// call was refused before it acted: an MCP SDK's (sdkRefusals) for any server, a policy's
// no_effect for its tools, and for the servers below the errors their write tools raise
// before their first write, read in their source. A server is known by the name in the
// serverInfo of its initialize answer (a session conversation; a stateless one has none),
// and a refusal counts only for the tools it is listed for, matched at the start of the
// first text block. Their other errors stay unknown.
//
// Every pattern must hold in every release of the server that gives that name (the
// reference servers give one fixed name and version across releases), so only errors raised
// before the first write in each release read are listed; mcpproxy/interop checks them
// against the release pinned in internal/fixture/testdata/tsclient.

// knownRefusal is one refusal of a known server: the tools it applies to and the start of
// its first text block.
type knownRefusal struct {
	tools []string
	re    *regexp.Regexp
}

// fsWrites are server-filesystem's write tools.
var fsWrites = []string{"write_file", "edit_file", "create_directory", "move_file"}

// knownServers holds the refusals of each known server by its serverInfo name.
var knownServers = map[string][]knownRefusal{
	// @modelcontextprotocol/server-filesystem, read in releases 2026.1.14, 2026.7.10 and
	// 2026.8.31: each write tool checks its paths first (validatePath: allowed roots,
	// symlinks, the parent directory); edit_file reads the file and applies its edits in
	// memory before it writes; a write goes to a temporary file renamed over the target (the
	// temporary file removed when that fails), or creates a new file exclusively (open
	// fails, or the file is new: a failed write is left out); move_file checks its
	// destination, then renames. create_directory's own errors (mkdir -p may have made some
	// directories) are left out.
	"secure-filesystem-server": {
		{fsWrites, regexp.MustCompile(`^Access denied - `)},
		{fsWrites, regexp.MustCompile(`^Parent directory does not exist: `)},
		{fsWrites, regexp.MustCompile(`^Ambiguous Unicode path component: `)},
		{fsWrites, regexp.MustCompile(`^E[A-Z]+: [^\n]*, (realpath|scandir) '`)},
		{[]string{"edit_file"}, regexp.MustCompile(`^Could not find exact match for edit:`)},
		{[]string{"edit_file"}, regexp.MustCompile(`^E[A-Z]+: [^\n]*, (open|read|stat|write|rename)( '|$)`)},
		{[]string{"write_file"}, regexp.MustCompile(`^E[A-Z]+: [^\n]*, (open|stat|rename) '`)},
		{[]string{"move_file"}, regexp.MustCompile(`^Destination already exists: `)},
		{[]string{"move_file"}, regexp.MustCompile(`^E[A-Z]+: [^\n]*, (lstat|rename) '`)},
	},
	// @modelcontextprotocol/server-memory, read in releases 2026.1.26, 2026.7.4 and
	// 2026.8.31: add_observations looks every entity up before it saves the graph.
	"memory-server": {
		{[]string{"add_observations"}, regexp.MustCompile(`^Entity with name [^\n]* not found$`)},
	},
}

// knownRefusalOf reports whether first, the first text block of an isError result of tool,
// is a refusal of the known server named server.
func knownRefusalOf(server, tool, first string) bool {
	for _, r := range knownServers[server] {
		for _, t := range r.tools {
			if t == tool && r.re.MatchString(first) {
				return true
			}
		}
	}
	return false
}

// withKnownRefusal returns rep, classify's report of upstream's answer resp to a call of
// tool, as failed when it is unknown only for an isError result whose first text block is
// a refusal of this session's upstream server (knownServers); rep unchanged otherwise.
func (s *session) withKnownRefusal(tool string, resp *jsonrpc.Response, rep interceptor.Report) interceptor.Report {
	server := s.serverName()
	if rep.Outcome != residual.Unknown || resp == nil || len(knownServers[server]) == 0 {
		return rep
	}
	var result struct {
		IsError bool `json:"isError"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	}
	if json.Unmarshal(resp.Result, &result) != nil || !result.IsError || len(result.Content) == 0 || result.Content[0].Type != "text" {
		return rep
	}
	if !knownRefusalOf(server, tool, result.Content[0].Text) {
		return rep
	}
	rep.Outcome = residual.Failed
	rep.Error = "isError result in the words with which " + server + " refuses a call before it acts: " + result.Content[0].Text
	return rep
}

// noteUpstream learns the upstream server's name from its answer m to the host's
// initialize (noteHost remembered its id).
func (s *session) noteUpstream(m *jsonrpc.Response) {
	s.mu.Lock()
	isInit := s.initID != "" && s.initID == hostKey(m.ID)
	s.mu.Unlock()
	if !isInit {
		return
	}
	var r struct {
		ServerInfo struct {
			Name string `json:"name"`
		} `json:"serverInfo"`
	}
	_ = json.Unmarshal(m.Result, &r)
	s.mu.Lock()
	s.initID, s.upName = "", r.ServerInfo.Name
	s.mu.Unlock()
}

// serverName is the name the upstream server gave in its initialize answer ("" before it,
// or when it gave none).
func (s *session) serverName() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.upName
}
