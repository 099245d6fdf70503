"""The paper's MLP on the embedded MNIST sample as a Flower app, valued with fedsv's FedSVStrategy."""
