package gantry

import (
	"context"

	"google.golang.org/grpc"
)

// WithToken sends `authorization: Bearer <token>` on every call, as the
// store's authentication expects. It does not require TLS, so that a
// local store on http:// works; use TLS transport credentials in
// production (the token is a password).
func WithToken(token string) grpc.DialOption {
	return grpc.WithPerRPCCredentials(bearer(token))
}

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }
