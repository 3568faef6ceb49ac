package gantry

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gantryv1 "github.com/gantry-dev/gantry/clients/go/gantry/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// selfSigned writes a certificate for 127.0.0.1 and its key; their paths.
func selfSigned(t *testing.T, dir string) (string, string) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "gateway-store"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	write(t, certPath, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	write(t, keyPath, string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})))
	return certPath, keyPath
}

func write(t *testing.T, path, content string) {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func get(conn interface {
	gantryv1.GatewayServiceClient
}, name string) error {
	_, err := conn.GetGateway(context.Background(), &gantryv1.GetGatewayRequest{Name: name})
	return err
}

// Over TLS with the store's CA, with a token file the operator rotates:
// each call sends the token the file holds now.
func TestDialTLSWithARotatedTokenFile(t *testing.T) {
	dir := t.TempDir()
	cert, key := selfSigned(t, dir)
	tokens := filepath.Join(dir, "tokens.csv")
	write(t, tokens, "token-one-0123456789,alice,viewer\ntoken-two-0123456789,alice,viewer\n")
	s := startStore(t, "--tokens-file", tokens, "--tls-cert", cert, "--tls-key", key)
	tokenFile := filepath.Join(dir, "token")
	write(t, tokenFile, "token-one-0123456789\n")

	conn, err := Dial("https://"+s.grpc, DialOptions{CAFile: cert, TokenFile: tokenFile})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := gantryv1.NewGatewayServiceClient(conn)
	if err := get(client, "absent"); status.Code(err) != codes.NotFound {
		t.Fatalf("with token-one-0123456789: %v", err)
	}
	// Rotation: a token the store does not know, then the next good one.
	// (Same size, so only the modification time tells them apart.)
	time.Sleep(10 * time.Millisecond)
	write(t, tokenFile, "token-bad-0123456789\n")
	future := time.Now().Add(time.Second)
	if err := os.Chtimes(tokenFile, future, future); err != nil {
		t.Fatal(err)
	}
	if err := get(client, "absent"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("with a revoked token: %v", err)
	}
	write(t, tokenFile, "token-two-0123456789\n")
	if err := get(client, "absent"); status.Code(err) != codes.NotFound {
		t.Fatalf("with token-two-0123456789: %v", err)
	}

	// Without the CA the store's certificate is not trusted.
	untrusting, err := Dial("https://"+s.grpc, DialOptions{TokenFile: tokenFile})
	if err != nil {
		t.Fatal(err)
	}
	defer untrusting.Close()
	if err := get(gantryv1.NewGatewayServiceClient(untrusting), "absent"); status.Code(err) != codes.Unavailable {
		t.Fatalf("an untrusted certificate: %v", err)
	}
}

// A token never leaves over plaintext unless the caller says so.
func TestDialRefusesATokenOverPlaintext(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.csv")
	write(t, tokens, "token-one-0123456789,alice,viewer\n")
	s := startStore(t, "--tokens-file", tokens)
	_, err := Dial("http://"+s.grpc, DialOptions{Token: "token-one-0123456789"})
	if err == nil || !strings.Contains(err.Error(), "plaintext") {
		t.Fatalf("a token over http:// was not refused: %v", err)
	}
	conn, err := Dial("http://"+s.grpc, DialOptions{Token: "token-one-0123456789", Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := get(gantryv1.NewGatewayServiceClient(conn), "absent"); status.Code(err) != codes.NotFound {
		t.Fatalf("with Insecure: %v", err)
	}
	// WithToken alone over plaintext: gRPC itself refuses the connection.
	_, err = Dial("http://"+s.grpc, DialOptions{}, WithToken("token-one-0123456789"))
	if err == nil || !strings.Contains(err.Error(), "transport level security") {
		t.Fatalf("WithToken over plaintext: %v", err)
	}
}
