package gantry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// DialOptions says how Dial reaches the store and who it says it is.
type DialOptions struct {
	// CAFile is a PEM bundle of the CAs that sign an https:// store's
	// certificate (the system's roots when empty).
	CAFile string
	// TokenFile holds the bearer token; it is read again whenever it
	// changes, so a rotated token (a Secret or a projected service-account
	// token the kubelet rewrites) is picked up without a new connection.
	TokenFile string
	// Token is a fixed bearer token (TokenFile wins when both are set).
	Token string
	// Insecure allows a token over a plaintext (http://) connection, for a
	// store on your own machine: anyone on the path could read it.
	Insecure bool
}

// Dial connects to the store at target, "https://host:port" (TLS) or
// "http://host:port" (plaintext; a bare "host:port" is plaintext too), with
// the token of opts on every call. A token over plaintext is refused unless
// opts.Insecure says so. extra options are passed to grpc.NewClient.
func Dial(target string, opts DialOptions, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	address, secure := strings.CutPrefix(target, "https://")
	if !secure {
		address = strings.TrimPrefix(target, "http://")
	}
	var transport credentials.TransportCredentials = insecure.NewCredentials()
	if secure {
		config := &tls.Config{MinVersion: tls.VersionTLS12}
		if opts.CAFile != "" {
			pem, err := os.ReadFile(opts.CAFile)
			if err != nil {
				return nil, fmt.Errorf("gantry: reading the CA bundle: %w", err)
			}
			config.RootCAs = x509.NewCertPool()
			if !config.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("gantry: %s holds no PEM certificate", opts.CAFile)
			}
		}
		transport = credentials.NewTLS(config)
	}
	options := []grpc.DialOption{grpc.WithTransportCredentials(transport)}
	var token *bearer
	switch {
	case opts.TokenFile != "":
		token = &bearer{file: opts.TokenFile}
		if _, err := token.current(); err != nil {
			return nil, err
		}
	case opts.Token != "":
		token = &bearer{token: opts.Token}
	}
	if token != nil {
		if !secure && !opts.Insecure {
			return nil, errors.New("gantry: refusing to send a token over plaintext (" + target +
				"): use https:// with the store's CA, or set DialOptions.Insecure for a store on this machine")
		}
		token.plaintext = !secure
		options = append(options, grpc.WithPerRPCCredentials(token))
	}
	return grpc.NewClient(address, append(options, extra...)...)
}

// WithToken sends `authorization: Bearer <token>` on every call. gRPC
// refuses to send it over a connection without TLS; Dial with
// DialOptions.Insecure is the way for a store on your own machine.
func WithToken(token string) grpc.DialOption {
	return grpc.WithPerRPCCredentials(&bearer{token: token})
}

// bearer is a fixed token, or the token of a file read again when its
// modification time or size changes.
type bearer struct {
	token     string
	file      string
	plaintext bool

	mu      sync.Mutex
	modTime time.Time
	size    int64
	cached  string
}

func (b *bearer) current() (string, error) {
	if b.file == "" {
		return b.token, nil
	}
	info, err := os.Stat(b.file)
	if err != nil {
		return "", fmt.Errorf("gantry: reading the token file: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cached != "" && info.ModTime().Equal(b.modTime) && info.Size() == b.size {
		return b.cached, nil
	}
	text, err := os.ReadFile(b.file)
	if err != nil {
		return "", fmt.Errorf("gantry: reading the token file: %w", err)
	}
	token := strings.TrimSpace(string(text))
	if token == "" {
		return "", fmt.Errorf("gantry: the token file %s is empty", b.file)
	}
	b.cached, b.modTime, b.size = token, info.ModTime(), info.Size()
	return token, nil
}

// GetRequestMetadata is the authorization header of one call.
func (b *bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	token, err := b.current()
	if err != nil {
		return nil, err
	}
	return map[string]string{"authorization": "Bearer " + token}, nil
}

// RequireTransportSecurity: only Dial's explicit Insecure lifts it.
func (b *bearer) RequireTransportSecurity() bool { return !b.plaintext }
