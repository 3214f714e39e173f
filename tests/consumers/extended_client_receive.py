"""Receives messages with the AWS SQS Extended Client library (PyPI amazon-sqs-extended-client),
as a consumer of the relay's large events would, and prints one JSON line per message:
its event_id attribute, the byte length and SHA-256 of the body the library resolved, and
whether the library found the reserved attribute (so the body came from S3).

Usage: extended_client_receive.py QUEUE_URL COUNT TIMEOUT_SECONDS
Endpoints come from AWS_ENDPOINT_URL_SQS / AWS_ENDPOINT_URL_S3 (botocore reads them).
"""

import hashlib
import json
import sys
import time

import boto3
import sqs_extended_client  # noqa: F401  (patches boto3's session with the extended client)


def main():
    queue_url, count, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    sqs = boto3.session.Session().client("sqs")
    # Any bucket name turns the library's large-payload support on; receiving reads the
    # bucket named in each pointer.
    sqs.large_payload_support = "unused-for-receiving"
    seen = 0
    deadline = time.monotonic() + timeout
    while seen < count and time.monotonic() < deadline:
        out = sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            MessageAttributeNames=["All"],
            WaitTimeSeconds=1,
            # Not deleted (the library's delete rewrites receipt handles): hidden instead.
            VisibilityTimeout=600,
        )
        for message in out.get("Messages", []):
            body = message["Body"].encode("utf-8")
            attributes = message.get("MessageAttributes", {})
            print(
                json.dumps(
                    {
                        "event_id": attributes["event_id"]["StringValue"],
                        "bytes": len(body),
                        "sha256": hashlib.sha256(body).hexdigest(),
                        "attributes": sorted(attributes),
                        "from_s3": "-..s3Key..-" in message["ReceiptHandle"],
                    }
                ),
                flush=True,
            )
            seen += 1
    if seen < count:
        sys.exit(f"received {seen} of {count} messages in {timeout} s")


if __name__ == "__main__":
    main()
