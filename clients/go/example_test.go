package gantry_test

import (
	"context"
	"fmt"
	"log"
	"os"

	gantry "github.com/gantry-dev/gantry/clients/go"
	gantryv1 "github.com/gantry-dev/gantry/clients/go/gantry/v1"
)

// Watches every gateway of a local store (gantry-local) and prints each
// change; resumes across restarts of the store by itself.
func Example() {
	conn, err := gantry.Dial("http://127.0.0.1:50051",
		gantry.DialOptions{Token: os.Getenv("GANTRY_TOKEN"), Insecure: true})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := gantryv1.NewGatewayServiceClient(conn)
	err = gantry.ListThenWatch(context.Background(), client, gantry.WatchOptions{},
		func(u gantry.Update) error {
			switch u.Kind {
			case gantry.InitPage:
				for _, g := range u.Gateways {
					fmt.Println("listed", g.GetMetadata().GetName(), g.GetStatus().GetPhase())
				}
			case gantry.Applied, gantry.Deleted:
				fmt.Println(u.Kind, u.Gateway.GetMetadata().GetName(), u.Gateway.GetStatus().GetPhase())
			case gantry.Interrupted:
				log.Printf("store lost (%v); retrying in %v", u.Err, u.RetryIn)
			}
			return nil
		})
	log.Fatal(err)
}

// Connects to the store GANTRY_SERVER names (https:// with
// DialOptions.CAFile in production) and creates a gateway.
func ExampleDial() {
	conn, err := gantry.Dial(os.Getenv("GANTRY_SERVER"), gantry.DialOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := gantryv1.NewGatewayServiceClient(conn)
	created, err := client.CreateGateway(context.Background(), &gantryv1.CreateGatewayRequest{
		Gateway: &gantryv1.Gateway{
			Metadata: &gantryv1.ObjectMeta{Name: "example-dial"},
			Spec:     &gantryv1.GatewaySpec{Image: "ghcr.io/acme/gateway:1.0"},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(created.GetMetadata().GetName(), "generation", created.GetMetadata().GetGeneration())
	// Output: example-dial generation 1
}

// Changes a gateway's image with a read-modify-write that survives a
// concurrent writer (the reconciler writes status right after a create).
func ExampleRetryOnConflict() {
	conn, err := gantry.Dial(os.Getenv("GANTRY_SERVER"), gantry.DialOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := gantryv1.NewGatewayServiceClient(conn)
	ctx := context.Background()
	_, err = client.CreateGateway(ctx, &gantryv1.CreateGatewayRequest{
		Gateway: &gantryv1.Gateway{
			Metadata: &gantryv1.ObjectMeta{Name: "example-retry"},
			Spec:     &gantryv1.GatewaySpec{Image: "ghcr.io/acme/gateway:1.0"},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	updated, err := gantry.RetryOnConflict(ctx, client, "example-retry", []string{"spec.image"},
		func(g *gantryv1.Gateway) error {
			g.Spec.Image = "ghcr.io/acme/gateway:1.1"
			return nil
		})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(updated.GetSpec().GetImage(), "generation", updated.GetMetadata().GetGeneration())
	// Output: ghcr.io/acme/gateway:1.1 generation 2
}
