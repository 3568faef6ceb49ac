package gantry_test

import (
	"context"
	"fmt"
	"log"
	"os"

	gantry "github.com/gantry-dev/gantry/clients/go"
	gantryv1 "github.com/gantry-dev/gantry/clients/go/gantry/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Watches every gateway of a local store (gantry-local) and prints each
// change; resumes across restarts of the store by itself.
func Example() {
	conn, err := grpc.NewClient("127.0.0.1:50051",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		gantry.WithToken(os.Getenv("GANTRY_TOKEN")))
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
