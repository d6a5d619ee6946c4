package shim

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv1"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv1/shimv1connect"
)

// sessionService serves SessionService (proto/airlock/shim/v1) on the shim
// socket over the shim's session table.
type sessionService struct {
	t *sessions
}

var _ shimv1connect.SessionServiceHandler = sessionService{}

func (v sessionService) lookup(id string) (*session, error) {
	if !sandbox.ValidExecID(id) {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no such exec"))
	}
	return v.t.Get(id)
}

func (v sessionService) Start(ctx context.Context, req *connect.Request[shimv1.StartRequest]) (*connect.Response[shimv1.StartResponse], error) {
	info, err := v.t.Start(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&shimv1.StartResponse{Info: info}), nil
}

func (v sessionService) Attach(ctx context.Context, req *connect.Request[shimv1.AttachRequest], out *connect.ServerStream[agentv1.ExecResponse]) error {
	s, err := v.lookup(req.Msg.GetExecId())
	if err != nil {
		return err
	}
	return s.Attach(ctx, v.t, req.Msg.GetFromStart(), out.Send)
}

func (v sessionService) Input(_ context.Context, req *connect.Request[shimv1.InputRequest]) (*connect.Response[shimv1.InputResponse], error) {
	s, err := v.lookup(req.Msg.GetExecId())
	if err != nil {
		return nil, err
	}
	if err := s.Input(req.Msg.GetData(), req.Msg.GetClose()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&shimv1.InputResponse{}), nil
}

func (v sessionService) Signal(_ context.Context, req *connect.Request[shimv1.SignalRequest]) (*connect.Response[shimv1.SignalResponse], error) {
	s, err := v.lookup(req.Msg.GetExecId())
	if err != nil {
		return nil, err
	}
	if err := s.Signal(req.Msg.GetSignal()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&shimv1.SignalResponse{}), nil
}

func (v sessionService) List(context.Context, *connect.Request[shimv1.ListRequest]) (*connect.Response[shimv1.ListResponse], error) {
	return connect.NewResponse(&shimv1.ListResponse{Execs: v.t.List()}), nil
}

func (v sessionService) Get(_ context.Context, req *connect.Request[shimv1.GetRequest]) (*connect.Response[shimv1.ExecInfo], error) {
	s, err := v.lookup(req.Msg.GetExecId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(s.info()), nil
}

// maxInputMessage caps one SessionService request (Input data).
const maxInputMessage = 8 << 20
