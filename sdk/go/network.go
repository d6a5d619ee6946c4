package airlock

import (
	"context"
	"net/http"
)

// Where a network change took effect (NetworkState.Applied).
const (
	// AppliedRunning: the running sandbox enforces the new policy now.
	AppliedRunning = "running"
	// AppliedResume: the sandbox is paused and gets the policy when it
	// resumes.
	AppliedResume = "resume"
)

// NetworkPolicy is a sandbox's whole egress policy for SetNetwork: rules
// it does not list are removed.
type NetworkPolicy struct {
	// Mode is NetworkPublic or NetworkDeny ("" means public, or deny when
	// Allow is set); NetworkNone only for a sandbox created with it.
	Mode string `json:"mode,omitempty"`
	// Allow rules, in the syntax of Network.Allow.
	Allow []string `json:"allow,omitempty"`
}

// NetworkState is a sandbox's network, and what a change did.
type NetworkState struct {
	// Network is the sandbox's network (secrets by name, never values).
	Network Network `json:"network"`
	// Closed counts the open connections and UDP flows the change closed
	// because the new policy forbids them (SetNetwork only).
	Closed int `json:"closed,omitempty"`
	// Applied is AppliedRunning or AppliedResume (SetNetwork only).
	Applied string `json:"applied,omitempty"`
}

// GetNetwork returns sandbox id's network. It never resumes a paused
// sandbox.
func (c *Client) GetNetwork(ctx context.Context, id string) (*NetworkState, error) {
	var out NetworkState
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id, "network"), nil, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

// SetNetwork replaces sandbox id's egress policy with p, whole; secrets,
// published ports and limits stay. A running sandbox enforces it at once:
// new connections are decided by it, and open ones it forbids are closed
// (each recorded as a net.deny event). A paused sandbox gets it when it
// resumes. Errors: ErrInvalid (a bad rule or mode, or a change into or
// out of mode none), ErrPermissionDenied (a rule that opens private,
// loopback, link-local or metadata addresses, without an admin key),
// ErrFailedPrecondition (a sandbox that is neither running nor paused).
func (c *Client) SetNetwork(ctx context.Context, id string, p NetworkPolicy) (*NetworkState, error) {
	var out NetworkState
	if err := c.doJSON(ctx, http.MethodPut, sandboxPath(id, "network"), nil, p, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}
