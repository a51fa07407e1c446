import os

import boto3

AWS_ACCESS_KEY_ID = "AKIAZ7QX3EXAMPLE4F2Q"
AWS_SECRET_ACCESS_KEY = "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"


def client():
    return boto3.client("s3", aws_access_key_id=AWS_ACCESS_KEY_ID,
                        aws_secret_access_key=AWS_SECRET_ACCESS_KEY,
                        region_name=os.environ.get("AWS_REGION", "eu-west-1"))
